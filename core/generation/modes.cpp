// SPDX-License-Identifier: Apache-2.0
#include "core/generation/modes.h"

#include "core/base/named.h"

namespace batchlens::generation {

const char* name(RngMode mode) {
  return mode == RngMode::PerRow ? "per_row" : "shared";
}

const char* name(PrefillMode mode) {
  return mode == PrefillMode::Copied ? "copied" : "batched";
}

const char* name(PositionMode mode) {
  return mode == PositionMode::Shared ? "shared" : "per_row";
}

base::Result<RngMode> parse_rng_mode(std::string_view text) {
  return base::parse_named(text, {RngMode::PerRow, RngMode::Shared}, &name, "rng");
}

base::Result<PrefillMode> parse_prefill_mode(std::string_view text) {
  return base::parse_named(text, {PrefillMode::Copied, PrefillMode::Batched}, &name, "prefill");
}

base::Result<PositionMode> parse_position_mode(std::string_view text) {
  return base::parse_named(text, {PositionMode::Shared, PositionMode::PerRow}, &name, "positions");
}

}  // namespace batchlens::generation
