// SPDX-License-Identifier: Apache-2.0
// Torch-free entry point to generation for the CLI and the UI.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/cancel.h"
#include "core/base/error.h"
#include "core/base/progress.h"
#include "core/model/loader.h"

namespace batchlens::sampling {

/// A generation run described with plain values.
struct GenerateRequest {
  std::vector<std::int64_t> prompt;  ///< prompt token ids
  std::int64_t batch_size = 1;
  std::uint64_t seed = 0;
  int max_denoising_steps = 48;
  std::int64_t max_new_tokens = 256;
  std::string rng = "per_row";     ///< "per_row" or "shared"
  std::string prefill = "copied";  ///< "copied" or "batched"
  std::string policy = "default";  ///< "default", "issue_workaround", "row_wise_all"
  const base::CancelToken* cancel = nullptr;
  base::ProgressFn progress;  ///< one report per denoising step (all rows)
};

/// Loads the model, generates and returns a report: per row the generated token ids, the
/// steps taken per canvas and the stop position. Errors as load_model and generate; Cancelled
/// when `cancel` fires. Never throws.
base::Result<std::string> run_generation(const model::ModelSource& source,
                                         const model::LoadOptions& load,
                                         const GenerateRequest& request);

}  // namespace batchlens::sampling
