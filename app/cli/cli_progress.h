// SPDX-License-Identifier: Apache-2.0
// Progress bar on stderr and Ctrl-C as cancellation, for long-running commands.
#pragma once

#include "core/base/cancel.h"
#include "core/base/progress.h"

namespace batchlens::cli {

/// "[#####.....]  40%  canvas 1 step 12/48  ETA 3.2s" on stderr, redrawn in place.
void draw_progress(const base::Progress& p);

/// While alive, SIGINT fires token() instead of ending the process (one at a time), through
/// base::set_signal_cancel: base::install_signal_cleanup() must have been called (main does).
/// A SIGINT while a file is being written still removes its temporary and exits 130.
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
};

}  // namespace batchlens::cli
