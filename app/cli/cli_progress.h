// SPDX-License-Identifier: Apache-2.0
// Progress bar on stderr and Ctrl-C as cancellation, for long-running commands.
#pragma once

#include <csignal>

#include "core/base/cancel.h"
#include "core/base/progress.h"

namespace batchlens::cli {

/// "[#####.....]  40%  canvas 1 step 12/48  ETA 3.2s" on stderr, redrawn in place.
void draw_progress(const base::Progress& p);

/// While alive, SIGINT fires token() instead of killing the process (one at a time).
class SigintCancel {
 public:
  SigintCancel();
  ~SigintCancel();
  SigintCancel(const SigintCancel&) = delete;
  SigintCancel& operator=(const SigintCancel&) = delete;
  SigintCancel(SigintCancel&&) = delete;
  SigintCancel& operator=(SigintCancel&&) = delete;

  const base::CancelToken* token() const { return &token_; }

 private:
  base::CancelToken token_;
  void (*previous_)(int) = nullptr;
};

}  // namespace batchlens::cli
