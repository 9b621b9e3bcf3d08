// SPDX-License-Identifier: Apache-2.0
// Comparing two engines of a group tick by tick: every tapped tensor of the tick in one kernel
// launch on the tensors' device (probe::position_diffs), routing flips and router margins, the
// sampler's decisions; the results stay on the device until the canvas ends and are read back
// in one transfer per kind (flush). Internal to core/experiment (LibTorch in the header).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/experiment/experiment.h"
#include "core/experiment/plan.h"
#include "core/experiment/stepper.h"

namespace batchlens::experiment {

/// One comparison of a group: `run`'s row 0 against `reference`'s (kind "row0"), or a batched
/// run's rows 1.. against its own row 0 (kind "rows", reference == run; aggregates only).
class Comparator {
 public:
  /// `diff_kernel`: whether the fused comparison kernel may run (base::Switches).
  Comparator(const PlannedComparison& planned, const Engine& reference, const Engine& run,
             Layout layout, bool diff_kernel);

  /// Queues this tick's comparison (or records that it compared nothing when an engine did not
  /// step); the engines' taps of the tick must still be there.
  void queue_tick();
  /// Reads the queued ticks' results back into the host arrays. The engines' own records must
  /// have been flushed first (the sampler decisions come from them).
  void flush();
  /// Row-0 comparisons: whether any flushed tick differs (a tap or a sampler decision).
  bool differs_so_far() const;
  /// The comparison after `ticks` ticks; `tap_names` label the T axis; `ref` and `run` are the
  /// two engines' finished results. Row-0 comparisons also get the token diff, and every
  /// comparison its first divergence.
  ComparisonResult finish(std::int64_t ticks, const std::vector<std::string>& tap_names,
                          const RunResult& ref, const RunResult& run);

 private:
  // One tick of the comparison, computed on the device and read back once per canvas: no host
  // synchronisation in the step loop.
  struct PendingTick {
    std::size_t base = 0;                                      // aggregates [L+1, T]
    std::size_t pbase = 0;                                     // per position [L+1, T, C]
    std::size_t lbase = 0;                                     // routing [L, C]
    std::size_t sbase = 0;                                     // sampler [C]
    std::vector<std::pair<std::int64_t, std::int64_t>> where;  // (slot, tap) per diff row
    at::Tensor diff;                                           // row0: [n, 3, C]; rows: [n, 3]
    bool sampler = false;  // compare the engines' sampler decisions (from their host records)
    // Row 0 of the router's choices, [L, C, K] each, and of the reference's scores [L, C, E]
    // (undefined when not tapped): flips and margins are computed once per canvas.
    at::Tensor ids_ref, ids_run, scores;
  };

  void queue_row0(bool both);
  void queue_rows(bool stepped);
  std::size_t grow_aggregates();
  std::pair<at::Tensor, at::Tensor> routing() const;
  void unpack_diff(const PendingTick& p, const float* d);
  void unpack_sampler(const PendingTick& p);

  ComparisonResult r_;
  const Engine* ref_;
  const Engine* run_;
  Layout lay_;
  bool diff_kernel_ = true;
  std::vector<float> frac_, abs_, ulp_, pos_, pos_abs_, pos_ulp_, margin_;
  std::vector<std::uint8_t> flips_, sampler_;
  std::vector<PendingTick> pending_;
};

}  // namespace batchlens::experiment
