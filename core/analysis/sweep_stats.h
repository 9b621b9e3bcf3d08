// SPDX-License-Identifier: Apache-2.0
// A sweep's statistics per group and batch size: how often the text changed (with its Wilson
// interval), how much, and where the divergence began.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/analysis/sweep_records.h"

namespace batchlens::analysis {

/// A binomial share's 95 % interval (Wilson score, z = 1.96).
struct Interval {
  double lo = 0.0;
  double hi = 0.0;
};
Interval wilson_interval(int k, int n);

/// Per group and batch size: how often the text changed, how much, and where it began.
struct SweepStats {
  experiment::RunGroup group = experiment::RunGroup::Main;
  int batch_size = 0;
  int n = 0;
  int text_changed = 0;
  Interval changed_ci;
  double tokens_changed_median = 0.0;
  std::int64_t tokens_changed_max = 0;
  int stop_changed = 0;
  int steps_changed = 0;
  int diverged = 0;                                ///< a first divergence was found
  std::map<std::pair<int, int>, int> first_steps;  ///< (canvas 0-based, step 1-based) -> items
  std::map<std::string, int> first_families;       ///< families behind the first tap -> items
};
std::vector<SweepStats> sweep_stats(const std::vector<SweepRow>& rows);

}  // namespace batchlens::analysis
