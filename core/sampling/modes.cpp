// SPDX-License-Identifier: Apache-2.0
#include "core/sampling/modes.h"

#include <string>

namespace batchlens::sampling {

const char* name(RngMode mode) {
  return mode == RngMode::PerRow ? "per_row" : "shared";
}

const char* name(PrefillMode mode) {
  return mode == PrefillMode::Copied ? "copied" : "batched";
}

base::Result<RngMode> parse_rng_mode(std::string_view text) {
  for (const RngMode m : {RngMode::PerRow, RngMode::Shared}) {
    if (text == name(m)) {
      return m;
    }
  }
  return base::Error{base::ErrorCode::InvalidArgument,
                     "rng '" + std::string(text) + "': expected per_row or shared"};
}

base::Result<PrefillMode> parse_prefill_mode(std::string_view text) {
  for (const PrefillMode m : {PrefillMode::Copied, PrefillMode::Batched}) {
    if (text == name(m)) {
      return m;
    }
  }
  return base::Error{base::ErrorCode::InvalidArgument,
                     "prefill '" + std::string(text) + "': expected copied or batched"};
}

}  // namespace batchlens::sampling
