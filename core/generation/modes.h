// SPDX-License-Identifier: Apache-2.0
// The generation modes a spec chooses, typed: names only at the edges (files, CLI, GUI).
// Torch-free header.
#pragma once

#include <string_view>

#include "core/base/error.h"

namespace batchlens::generation {

/// Where random numbers come from. Per-row (BatchLens's default): logical row r owns one
/// generator seeded from (seed, r) - row 0 with `seed` itself - so a row draws the same numbers
/// at any batch size. Shared (the reference's behaviour): one generator for the batch, drawn
/// in batch order, so what a row sees depends on the batch size.
enum class RngMode { PerRow, Shared };

/// How the prompt cache is built for a batch of identical rows.
enum class PrefillMode {
  Copied,   ///< prefill at batch 1, copy the cache into every row (the user's setup)
  Batched,  ///< prefill all rows together (prefill kernels then see the batch shape too)
};

/// How the rows of a batch of different prompts (left-padded to the longest) get their position
/// ids (issue #35).
enum class PositionMode {
  Shared,  ///< one set for every row, counting padding slots: transformers' generate
  PerRow,  ///< each row its own, counting its real tokens only (what a fix would do)
};

/// "per_row" / "shared".
const char* name(RngMode mode);
/// "shared" / "per_row".
const char* name(PositionMode mode);
/// "copied" / "batched".
const char* name(PrefillMode mode);
/// The mode of a name; InvalidArgument naming the accepted ones otherwise.
base::Result<RngMode> parse_rng_mode(std::string_view text);
base::Result<PrefillMode> parse_prefill_mode(std::string_view text);
base::Result<PositionMode> parse_position_mode(std::string_view text);

}  // namespace batchlens::generation
