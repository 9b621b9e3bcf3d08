// SPDX-License-Identifier: Apache-2.0
// Causes of a mixed batch's divergence told apart (issue #35), as a value of the experiment file
// (/causes): what the row under test's inputs are in each batch (padding slots, position
// shift), the re-runs that separate the causes (every op batch-invariant, per-row positions) and
// the verdict. The re-runs themselves are analysis/causes.h. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/base/error.h"

namespace batchlens::experiment {

/// The row under test in one batched run of a mixed batch.
struct RowLayout {
  std::string run;  ///< "b4", "wa.b4"
  std::int64_t batch_size = 0;
  std::int64_t pad_slots = 0;       ///< padding slots left of its prompt (the mask hides them)
  std::int64_t position_shift = 0;  ///< its positions minus its own (shared positions: the pad)
  std::int64_t tokens = 0;          ///< its prompt's tokens
  std::int64_t longest = 0;         ///< the batch's longest prompt
};

/// One re-run of the spec with one cause taken away.
struct CauseTrial {
  std::string name;       ///< "batch_invariant", "per_row", "per_row+batch_invariant"
  std::string policy;     ///< its policy (ops::policy_text)
  std::string positions;  ///< "shared" / "per_row"
  bool diverges = false;  ///< some batch's row under test still differs from B=1
  std::string first;      ///< where (its first divergence), "" when none
  double wall_s = 0.0;
};

/// What a mixed batch's divergence comes from.
struct CauseReport {
  std::vector<RowLayout> rows;
  std::vector<CauseTrial> trials;  ///< empty until the re-runs ran (analysis::find_causes)
  /// Each of "positions", "mask", "kernels" that the trials show to matter, in that order.
  std::vector<std::string> causes;
  std::string verdict;  ///< one plain sentence; "" until the re-runs ran
  double wall_s = 0.0;

  /// "the row under test: 4 padding slots, positions shifted by 4 (B=2); ..." from `rows`.
  std::string layout_text() const;
};

nlohmann::json to_json(const CauseReport& report);
/// Inverse of to_json, for files: InvalidArgument naming the field on malformed input. Never
/// throws.
base::Result<CauseReport> causes_from_json(const nlohmann::json& doc);

}  // namespace batchlens::experiment
