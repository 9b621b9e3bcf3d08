// SPDX-License-Identifier: Apache-2.0
// A run and what BatchLens explains after it: the one front door of `batchlens-cli run` and the
// GUI's Run panel. Torch-free header.
#pragma once

#include "core/base/error.h"
#include "core/experiment/experiment.h"
#include "core/experiment/runner.h"

namespace batchlens::analysis {

/// What a run explains once it ran.
struct Explain {
  bool causes = true;  ///< with companions: the causes told apart (find_causes, issue #35)
  bool exact = true;   ///< where row 0 diverges: the exact (fp64) reference (exact_at_divergence)
};

/// Opens a session for `spec` (as run_experiment(spec) does), runs it, and explains there what
/// `explain` asks for into the result's `causes` and `exact` (an exact reference that fails, e.g.
/// out of memory for its fp64 copies, is a note in `exact`: the experiment is kept). Errors: those
/// of open_session, run_experiment and find_causes; Cancelled. Never throws.
base::Result<experiment::ExperimentResult> run_and_explain(
    const experiment::ExperimentSpec& spec, const Explain& explain = {},
    const experiment::RunControl& control = {});

}  // namespace batchlens::analysis
