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
  CancelToken() = default;
  /// A token that is also cancelled while `parent` is (null: none); `parent` must outlive it.
  explicit CancelToken(const CancelToken* parent) : parent_(parent) {}
  /// Requests cancellation. Work notices it at its next check point.
  void cancel() { flag_.store(true, std::memory_order_relaxed); }
  /// True once cancel() was called, on this token or on its parent.
  bool cancelled() const {
    return flag_.load(std::memory_order_relaxed) || (parent_ != nullptr && parent_->cancelled());
  }
  /// Clears this token's own flag so it can be reused for the next run.
  void reset() { flag_.store(false, std::memory_order_relaxed); }

 private:
  std::atomic<bool> flag_{false};
  const CancelToken* parent_ = nullptr;
};

using CancelTokenPtr = std::shared_ptr<CancelToken>;

}  // namespace batchlens::base
