// SPDX-License-Identifier: Apache-2.0
// The matmul-like operations of DiffusionGemma, named once for the model, policies, files and
// the UI. Torch-free.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace batchlens::ops {

/// Every matmul-like call in the model carries one of these (and its layer index).
enum class OpFamily {
  QProj,           ///< q_proj   [T, H] x [Hq*D, H]^T
  KProj,           ///< k_proj
  VProj,           ///< v_proj (sliding layers only)
  OProj,           ///< o_proj
  Attention,       ///< scaled dot-product attention over [cache | canvas]
  MlpGate,         ///< dense MLP gate_proj
  MlpUp,           ///< dense MLP up_proj
  MlpDown,         ///< dense MLP down_proj
  RouterProj,      ///< MoE router projection [T, H] x [E, H]^T (the user's first culprit)
  ExpertGateUp,    ///< expert gate_up GEMMs (per expert, or one grouped GEMM)
  ExpertDown,      ///< expert down GEMMs
  SelfCondMatmul,  ///< softmax(S).bf16 [T, V] x E [V, H] (the user's second culprit)
  SelfCondMlp,     ///< self-conditioning gate/up/down projections
  LmHead,          ///< tied lm_head [T, H] x E^T
};

inline constexpr int kOpFamilyCount = 14;

/// Snake-case name stored in files and policies, e.g. "router_proj".
std::string_view family_name(OpFamily family);
/// Human label, e.g. "Router projection".
std::string_view family_label(OpFamily family);
/// Family by name.
std::optional<OpFamily> family_from_name(std::string_view name);
/// True when the family runs once per layer; false for the per-step ops (self-conditioning,
/// lm_head), which are addressed with layer kNoLayer (-1).
bool family_is_per_layer(OpFamily family);
/// Every family, in enum order.
std::array<OpFamily, kOpFamilyCount> all_families();

/// The profiler scope name of an op call: "bl/<family>/<layer>" (layer -1 for per-step ops).
std::string op_scope_name(OpFamily family, int layer);

}  // namespace batchlens::ops
