// SPDX-License-Identifier: Apache-2.0
// Progress of long-running core work (done/total, stage, elapsed, ETA) and the clock that
// estimates it, reported to a callback the UI or the CLI draws.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace batchlens::base {

/// One progress report from long-running core work. Plain data, copied to the receiver.
struct Progress {
  std::int64_t done = 0;   ///< units of work finished (e.g. denoising steps over all runs)
  std::int64_t total = 0;  ///< units expected in all; 0 when unknown
  std::string stage;       ///< what is running now, e.g. "B=4 step 12/48"
  double elapsed_s = 0.0;  ///< wall time since the work started
  double eta_s = -1.0;     ///< estimated seconds left; negative when unknown

  /// done/total in [0, 1]; 0 when total is unknown.
  double fraction() const {
    return total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 0.0;
  }
};

/// Called from the worker thread; must be cheap and must not throw.
using ProgressFn = std::function<void(const Progress&)>;

/// Computes elapsed time and a linear ETA for a known amount of work.
/// Not thread-safe: owned by the thread doing the work.
class ProgressClock {
 public:
  explicit ProgressClock(std::int64_t total) : total_(total), start_(Clock::now()) {}

  std::int64_t total() const { return total_; }

  /// A Progress for `done` units finished, with elapsed time and ETA filled in.
  Progress at(std::int64_t done, std::string stage) const {
    Progress p;
    p.done = done;
    p.total = total_;
    p.stage = std::move(stage);
    p.elapsed_s = std::chrono::duration<double>(Clock::now() - start_).count();
    if (done > 0 && total_ > 0) {
      p.eta_s = p.elapsed_s * static_cast<double>(total_ - done) / static_cast<double>(done);
    }
    return p;
  }

 private:
  using Clock = std::chrono::steady_clock;
  std::int64_t total_;
  Clock::time_point start_;
};

}  // namespace batchlens::base
