// SPDX-License-Identifier: Apache-2.0
// Cooperative cancellation: a token the UI or a signal handler sets and long-running core work
// checks between steps.
#pragma once

#include <atomic>
#include <memory>

namespace batchlens::base {

/// A cancellation flag shared between the thread that runs work and the one that may cancel it.
/// Thread-safe: cancel() and cancelled() may be called from any thread at any time.
class CancelToken {
 public:
  /// Requests cancellation. Work notices it at its next check point.
  void cancel() { flag_.store(true, std::memory_order_relaxed); }
  /// True once cancel() was called.
  bool cancelled() const { return flag_.load(std::memory_order_relaxed); }
  /// Clears the flag so the token can be reused for the next run.
  void reset() { flag_.store(false, std::memory_order_relaxed); }

 private:
  std::atomic<bool> flag_{false};
};

using CancelTokenPtr = std::shared_ptr<CancelToken>;

}  // namespace batchlens::base
