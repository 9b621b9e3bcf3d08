// SPDX-License-Identifier: Apache-2.0
// Which strategy computes each (op family, layer): the run-time knob behind workarounds,
// emulation and the culprit finder. Torch-free: experiment specs and the UI hold policies.
#pragma once

#include <bitset>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/base/error.h"
#include "core/ops/op_family.h"

namespace batchlens::ops {

/// How one op call is computed.
enum class Strategy {
  Batched,  ///< one call over the whole batch, as transformers does ("default")
  RowWise,  ///< one call per logical row (batch element), results concatenated
  /// One call over the whole batch with a kernel whose per-row reduction order does not depend
  /// on how many rows the call has (fixed tiles, no M-dependent split): the fix serving engines
  /// use instead of serialising. See ops::OpRunner for what computes it on each device.
  BatchInvariant,
};

/// "batched", "row_wise", "batch_invariant".
std::string_view strategy_name(Strategy strategy);

using FamilySet = std::bitset<kOpFamilyCount>;

/// A set of families with a layer range and the strategy they get. Per-step families
/// (self-conditioning, lm_head) match a rule whenever their family is in the set.
struct PolicyRule {
  FamilySet families;
  int first_layer = 0;  ///< inclusive
  int last_layer = -1;  ///< inclusive; -1 = through the last layer
  Strategy strategy = Strategy::RowWise;

  bool matches(OpFamily family, int layer) const;
  friend bool operator==(const PolicyRule& a, const PolicyRule& b) {
    return a.families == b.families && a.first_layer == b.first_layer &&
           a.last_layer == b.last_layer && a.strategy == b.strategy;
  }
  friend bool operator!=(const PolicyRule& a, const PolicyRule& b) { return !(a == b); }
};

/// An ordered list of rules; the last rule that matches an op decides, ops no rule matches
/// run Batched. Value type, cheap to copy.
struct OpPolicy {
  std::string name = "default";
  std::vector<PolicyRule> rules;
  /// Families whose GEMMs use the emulated split-K kernel (CPU only, an EMULATION of GPU
  /// libraries choosing the K split by shape; see ops::emulated_split_count). Orthogonal to
  /// the strategy: a row-wise op runs the same kernel once per row.
  FamilySet emulate_split_k;

  Strategy resolve(OpFamily family, int layer) const;
  bool emulates(OpFamily family) const {
    return emulate_split_k.test(static_cast<std::size_t>(family));
  }
  /// True when every op is computed as transformers computes it.
  bool is_default() const { return rules.empty() && emulate_split_k.none(); }

  /// Everything Batched, as transformers computes it.
  static OpPolicy default_policy();
  /// The given families row-wise in every layer.
  static OpPolicy row_wise(FamilySet families, std::string name = "row_wise");
  /// Every family row-wise in every layer: each row computed exactly as at batch size 1.
  static OpPolicy row_wise_all();
  /// The given families batch-invariant in every layer.
  static OpPolicy batch_invariant(FamilySet families, std::string name = "batch_invariant");
  /// Every family batch-invariant in every layer ("batch_invariant").
  static OpPolicy batch_invariant_all();
  /// The user's recipe: router projection in all layers + self-conditioning matmul row-wise.
  static OpPolicy issue_workaround();
  /// Every GEMM family (all but attention) on the emulated split-K kernel, batched.
  static OpPolicy emulated_split_k();
  /// The emulation profile of a recorded GPU (EmulationProfile), batched.
  static OpPolicy emulation_profile(std::string_view name);

  /// Same name, rules and emulation.
  friend bool operator==(const OpPolicy& a, const OpPolicy& b) {
    return a.name == b.name && a.rules == b.rules && a.emulate_split_k == b.emulate_split_k;
  }
  friend bool operator!=(const OpPolicy& a, const OpPolicy& b) { return !(a == b); }
};

/// The GEMM families the emulation can apply to (every family but Attention).
FamilySet gemm_families();

/// A named CPU emulation of one GPU's finding: split-K emulated only in the families that
/// diverged on that GPU, so the CPU demo tells the GPU's story (the same first divergence, the
/// same workaround fixing it). Taken from recorded findings, never guessed.
struct EmulationProfile {
  std::string_view name;         ///< policy name, e.g. "emulated_h200"
  FamilySet families;            ///< the families whose GEMMs are emulated
  std::string_view gpu;          ///< "NVIDIA H200"
  std::string_view description;  ///< one sentence for the UI and reports
  std::string_view source;       ///< where the finding is recorded
};
/// The profiles, the default first: emulated_h200, emulated_h100_report, emulated_split_k.
const std::vector<EmulationProfile>& emulation_profiles();
/// The profile of a policy name, or null.
const EmulationProfile* find_emulation_profile(std::string_view name);

/// `a` then `b`: b's rules after a's (so b wins where both match), emulation sets joined,
/// names joined with "+".
OpPolicy combine(const OpPolicy& a, const OpPolicy& b);

/// The set of `families`.
FamilySet family_set(std::initializer_list<OpFamily> families);
/// "{router_proj, selfcond_matmul}": the families of a set in their enum order.
std::string family_list(const FamilySet& families);
/// FamilySet from names; InvalidArgument naming an unknown family. Never throws.
base::Result<FamilySet> parse_families(const std::vector<std::string>& names);
/// {"name": ..., "rules": [{"families": [...], "first_layer": 0, "last_layer": -1,
///  "strategy": "row_wise"}]}
nlohmann::json to_json(const OpPolicy& policy);
/// Inverse of to_json; InvalidArgument on malformed input. Never throws.
base::Result<OpPolicy> policy_from_json(const nlohmann::json& doc);
/// The text form of a policy in experiment specs, settings and on the command line: a named
/// policy ("default", "issue_workaround", "row_wise_all", "batch_invariant", an emulation
/// profile's name:
/// "emulated_h200", "emulated_h100_report", "emulated_split_k"), inline policy
/// JSON (text starting with '{': to_json's format, nesting limited, never echoed in messages),
/// or such parts joined with "+" (combined left to right, e.g.
/// "emulated_split_k+issue_workaround"; at most kMaxPolicyParts parts, kMaxPolicyTextBytes
/// bytes). InvalidArgument otherwise. Never throws, never recurses per part.
inline constexpr std::size_t kMaxPolicyParts = 256;
inline constexpr std::size_t kMaxPolicyTextBytes = std::size_t{1} << 20;
base::Result<OpPolicy> policy_from_text(const std::string& text);
/// Inverse of policy_from_text: the policy's name when policy_from_text(name) gives the policy
/// back (every named policy and their combinations), else its compact to_json.
std::string policy_text(const OpPolicy& policy);

/// The command line's --policy: policy_from_text, or else a policy JSON file (to_json's format;
/// FIFOs, devices and folders refused without blocking). InvalidArgument for anything else or a
/// malformed file. Never throws.
base::Result<OpPolicy> policy_from_argument(const std::string& text_or_file);

/// The families some rule of `policy` gives `strategy` (in any layer).
FamilySet families_with(const OpPolicy& policy, Strategy strategy);

/// A one-line description, e.g. "issue_workaround: row_wise {router_proj, selfcond_matmul}".
std::string describe(const OpPolicy& policy);

}  // namespace batchlens::ops
