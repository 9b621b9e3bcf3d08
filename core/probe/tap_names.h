// SPDX-License-Identifier: Apache-2.0
// The one registry of tap names: the model records under these, experiment files store these
// strings and the UI labels them. Torch-free, so ui and app may include it.
#pragma once

#include <array>
#include <optional>
#include <string_view>

namespace batchlens::probe {

/// A named intermediate tensor of the model. Per-layer taps are recorded once per layer,
/// per-step taps with layer kNoLayer. Shapes are those of the decoder over a canvas of C
/// positions at batch size B.
enum class Tap {
  AttnQ,              ///< attn.q        [B, C, Hq, D] after q_norm and RoPE
  AttnK,              ///< attn.k        [B, C, Hkv, D] after k_norm and RoPE (canvas part)
  AttnV,              ///< attn.v        [B, C, Hkv, D] after v_norm (canvas part)
  AttnOut,            ///< attn.out      [B, C, Hq * D] attention output before o_proj
  AttnOProj,          ///< attn.o_proj   [B, C, H] o_proj output
  MlpOut,             ///< mlp.out       [B, C, H] dense MLP output (before its post norm)
  RouterScores,       ///< router.scores [B, C, E] router projection output (bf16 scores)
  RouterTopkIds,      ///< router.topk_ids     [B, C, K] int64 chosen experts
  RouterTopkWeights,  ///< router.topk_weights [B, C, K] fp32 weights after renormalisation
  MoeOut,             ///< moe.out       [B, C, H] experts output (before its post norm)
  LayerOut,           ///< layer.out     [B, C, H] residual stream after the layer
  SelfCondSoftEmbed,  ///< selfcond.soft_embed [B, C, H] softmax(S) @ E * embed_scale
  SelfCondOut,        ///< selfcond.out  [B, C, H] decoder input after self-conditioning
  Logits,             ///< logits        [B, C, V] fp32 soft-capped token scores
};

inline constexpr int kTapCount = 14;
inline constexpr int kNoLayer = -1;  ///< layer index of per-step taps

/// "router.scores" etc.
std::string_view tap_name(Tap tap);
/// The tap with this name, if any.
std::optional<Tap> tap_from_name(std::string_view name);
/// True for taps recorded once per layer; false for per-step taps (self-conditioning, logits).
bool tap_is_per_layer(Tap tap);
/// A short human label, e.g. "Router scores".
std::string_view tap_label(Tap tap);
/// Every tap, in enum order.
std::array<Tap, kTapCount> all_taps();

}  // namespace batchlens::probe
