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

/// Which of a sweep's axes (issue #35) its statistics keep apart: each value of the companions
/// and of the row under test on its own, or all of them together.
struct SweepGrouping {
  bool companions = true;
  bool row = true;
};

/// Per group and batch size (and value of the kept axes): how often the text changed, how much,
/// and where it began.
struct SweepStats {
  experiment::RunGroup group = experiment::RunGroup::Main;
  int batch_size = 0;
  int companions = -1;    ///< index into the spec's companion_sets; -1: every set together
  std::int64_t row = -1;  ///< the row under test; -1: every row together
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
/// The statistics of `rows` (items of `spec`), main before workaround, then by batch size, set of
/// companions and row. Rows of items the spec does not have are left out.
std::vector<SweepStats> sweep_stats(const SweepSpec& spec, const std::vector<SweepRow>& rows,
                                    const SweepGrouping& grouping = {});

/// The rows of `rows` whose items have the set of companions `companions` and the row under test
/// `row` (-1: any), for statistics of one value of an axis.
std::vector<SweepRow> rows_where(const SweepSpec& spec, const std::vector<SweepRow>& rows,
                                 int companions, std::int64_t row);

/// "companions 2 (3 prompts)", "identical rows", "row 1": the value of an axis as the statistics
/// name it ("" for -1).
std::string companions_label(const SweepSpec& spec, int companions);

}  // namespace batchlens::analysis
