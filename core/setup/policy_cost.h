// SPDX-License-Identifier: Apache-2.0
// What a fix costs, measured once for everyone: the decoder forward as the engine runs it, per
// policy and batch size, on one loaded model. `batchlens-cli cost`, the culprit finder and the
// GUI's culprit run all use it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/base/error.h"
#include "core/ops/policy.h"

namespace batchlens::model {
class DiffusionGemma;
}

namespace batchlens::setup {

/// What a fix costs: the decoder forward as the engine runs it (ForwardRequest::engine_timing,
/// self-conditioning on, seeded random inputs, identical rows) for every policy at every batch
/// size, on one loaded model.
struct PolicyCostRequest {
  std::vector<std::pair<std::string, ops::OpPolicy>> policies;  ///< label and policy
  std::vector<std::int64_t> batch_sizes{1, 2, 4, 8, 16, 32};
  int repeat = 20;  ///< timed passes per cell (median kept)
  std::int64_t prompt_length = 20;
  std::uint64_t input_seed = 0;
  /// Called after each cell with (cells done, cells in all); returns false to stop (Cancelled).
  std::function<bool(int, int)> progress;
};

struct PolicyCostCell {
  double median_ms = 0.0;
  double min_ms = 0.0;
  std::string mode;  ///< ForwardSummary::engine_mode
};

struct PolicyCosts {
  std::vector<std::string> labels;
  std::vector<std::string> policies;  ///< ops::policy_text of each
  std::vector<std::int64_t> batch_sizes;
  int repeat = 0;
  std::vector<std::vector<PolicyCostCell>> cells;  ///< [policy][batch size]
  /// DiffusionGemma::batch_invariance().report when a policy uses the batch-invariant strategy.
  std::string invariance_report;
  std::string fused_report;
};

/// Measures it. Errors as run_forward_file (a batch-invariant family the model could not prove
/// is InvalidArgument), Cancelled from progress. Never throws.
base::Result<PolicyCosts> measure_policy_costs(const model::DiffusionGemma& model,
                                               const PolicyCostRequest& request);

}  // namespace batchlens::setup
