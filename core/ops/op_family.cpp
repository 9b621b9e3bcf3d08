// SPDX-License-Identifier: Apache-2.0
#include "core/ops/op_family.h"

#include <string>

namespace batchlens::ops {

namespace {

struct FamilyEntry {
  OpFamily family;
  std::string_view name;
  std::string_view label;
  bool per_layer;
};

constexpr std::array<FamilyEntry, kOpFamilyCount> kFamilies{{
    {OpFamily::QProj, "q_proj", "q projection", true},
    {OpFamily::KProj, "k_proj", "k projection", true},
    {OpFamily::VProj, "v_proj", "v projection", true},
    {OpFamily::OProj, "o_proj", "o projection", true},
    {OpFamily::Attention, "attention", "Attention (SDPA)", true},
    {OpFamily::MlpGate, "mlp_gate", "Dense MLP gate", true},
    {OpFamily::MlpUp, "mlp_up", "Dense MLP up", true},
    {OpFamily::MlpDown, "mlp_down", "Dense MLP down", true},
    {OpFamily::RouterProj, "router_proj", "Router projection", true},
    {OpFamily::ExpertGateUp, "expert_gate_up", "Expert gate/up GEMM", true},
    {OpFamily::ExpertDown, "expert_down", "Expert down GEMM", true},
    {OpFamily::SelfCondMatmul, "selfcond_matmul", "Self-conditioning matmul", false},
    {OpFamily::SelfCondMlp, "selfcond_mlp", "Self-conditioning MLP", false},
    {OpFamily::LmHead, "lm_head", "LM head", false},
}};

const FamilyEntry& entry(OpFamily f) {
  return kFamilies[static_cast<std::size_t>(f)];
}

}  // namespace

std::string_view family_name(OpFamily family) {
  return entry(family).name;
}
std::string_view family_label(OpFamily family) {
  return entry(family).label;
}
bool family_is_per_layer(OpFamily family) {
  return entry(family).per_layer;
}

std::optional<OpFamily> family_from_name(std::string_view name) {
  for (const auto& e : kFamilies) {
    if (e.name == name) {
      return e.family;
    }
  }
  return std::nullopt;
}

std::array<OpFamily, kOpFamilyCount> all_families() {
  std::array<OpFamily, kOpFamilyCount> out{};
  for (std::size_t i = 0; i < kFamilies.size(); ++i) {
    out[i] = kFamilies[i].family;
  }
  return out;
}

std::string op_scope_name(OpFamily family, int layer) {
  return "bl/" + std::string(family_name(family)) + "/" + std::to_string(layer);
}

}  // namespace batchlens::ops
