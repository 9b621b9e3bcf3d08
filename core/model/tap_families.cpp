// SPDX-License-Identifier: Apache-2.0
#include "core/model/tap_families.h"

#include "core/probe/tap_names.h"

namespace batchlens::model {

ops::FamilySet families_behind(const std::string& tap) {
  const auto t = probe::tap_from_name(tap);
  if (!t) {
    return {};
  }
  switch (*t) {
    case probe::Tap::AttnQ:
      return ops::family_set({ops::OpFamily::QProj});
    case probe::Tap::AttnK:
      return ops::family_set({ops::OpFamily::KProj});
    case probe::Tap::AttnV:
      return ops::family_set(
          {ops::OpFamily::VProj, ops::OpFamily::KProj});  // full layers: v is k (k_eq_v)
    case probe::Tap::AttnOut:
      return ops::family_set({ops::OpFamily::Attention});
    case probe::Tap::AttnOProj:
      return ops::family_set({ops::OpFamily::OProj});
    case probe::Tap::MlpOut:
      return ops::family_set(
          {ops::OpFamily::MlpGate, ops::OpFamily::MlpUp, ops::OpFamily::MlpDown});
    case probe::Tap::RouterScores:
    case probe::Tap::RouterTopkIds:
    case probe::Tap::RouterTopkWeights:
      return ops::family_set({ops::OpFamily::RouterProj});
    case probe::Tap::MoeOut:
      return ops::family_set({ops::OpFamily::ExpertGateUp, ops::OpFamily::ExpertDown});
    case probe::Tap::SelfCondSoftEmbed:
      return ops::family_set({ops::OpFamily::SelfCondMatmul});
    case probe::Tap::SelfCondOut:
      return ops::family_set({ops::OpFamily::SelfCondMlp});
    case probe::Tap::Logits:
      return ops::family_set({ops::OpFamily::LmHead});
    case probe::Tap::LayerOut:
      break;  // norms and residual adds only: the op behind is upstream
  }
  return {};
}

}  // namespace batchlens::model
