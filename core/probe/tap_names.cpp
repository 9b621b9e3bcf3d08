// SPDX-License-Identifier: Apache-2.0
#include "core/probe/tap_names.h"

namespace batchlens::probe {

namespace {

struct TapEntry {
  Tap tap;
  std::string_view name;
  std::string_view label;
  bool per_layer;
};

constexpr std::array<TapEntry, kTapCount> kTaps{{
    {Tap::AttnQ, "attn.q", "Attention queries", true},
    {Tap::AttnK, "attn.k", "Attention keys", true},
    {Tap::AttnV, "attn.v", "Attention values", true},
    {Tap::AttnOut, "attn.out", "Attention output", true},
    {Tap::AttnOProj, "attn.o_proj", "o_proj output", true},
    {Tap::MlpOut, "mlp.out", "Dense MLP output", true},
    {Tap::RouterScores, "router.scores", "Router scores", true},
    {Tap::RouterTopkIds, "router.topk_ids", "Router top-k experts", true},
    {Tap::RouterTopkWeights, "router.topk_weights", "Router top-k weights", true},
    {Tap::MoeOut, "moe.out", "MoE output", true},
    {Tap::LayerOut, "layer.out", "Layer output (hidden state)", true},
    {Tap::SelfCondSoftEmbed, "selfcond.soft_embed", "Self-conditioning soft embedding", false},
    {Tap::SelfCondOut, "selfcond.out", "Self-conditioning output", false},
    {Tap::Logits, "logits", "Token scores (logits)", false},
}};

const TapEntry& entry(Tap tap) {
  return kTaps[static_cast<std::size_t>(tap)];
}

}  // namespace

std::string_view tap_name(Tap tap) {
  return entry(tap).name;
}
std::string_view tap_label(Tap tap) {
  return entry(tap).label;
}
bool tap_is_per_layer(Tap tap) {
  return entry(tap).per_layer;
}

std::optional<Tap> tap_from_name(std::string_view name) {
  for (const auto& e : kTaps) {
    if (e.name == name) {
      return e.tap;
    }
  }
  return std::nullopt;
}

std::array<Tap, kTapCount> all_taps() {
  std::array<Tap, kTapCount> out{};
  for (std::size_t i = 0; i < kTaps.size(); ++i) {
    out[i] = kTaps[i].tap;
  }
  return out;
}

}  // namespace batchlens::probe
