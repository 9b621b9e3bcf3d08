// SPDX-License-Identifier: Apache-2.0
// Telling a mixed batch's causes apart (issue #35). Beside other prompts the row under test can
// leave B=1 for three reasons: its position ids (transformers' generate gives the whole batch one
// set from the padded length, and bf16 RoPE is not relative), the padding slots its attention
// masks (a reduction over more keys), and the batch-shape-dependent kernels every batch has.
// Three re-runs take them away one by one: every op batch-invariant (the kernels), per-row
// positions (the positions), and both (what remains is the mask). Torch-free header.
#pragma once

#include "core/base/error.h"
#include "core/experiment/experiment.h"
#include "core/experiment/runner.h"

namespace batchlens::setup {
struct Session;
}

namespace batchlens::analysis {

/// Runs the re-runs for `shown` (an experiment with companions, run on `session`'s model) and
/// returns its causes: shown.causes' layouts (or none) with the trials, the causes that matter
/// and the verdict. Each trial is the main group only (no repeats, no workaround, no kernel
/// provenance, the logits tapped), stopped at the first difference of a row under test; the
/// spec's policy (an emulation profile) stays under each. Errors: InvalidArgument for a spec
/// without companions; those of run_experiment (Cancelled included). Never throws.
base::Result<experiment::CauseReport> find_causes(const setup::Session& session,
                                                  const experiment::ExperimentResult& shown,
                                                  const experiment::RunControl& control = {});

/// The verdict of `trials` (batch_invariant, per_row, per_row+batch_invariant) for an
/// experiment that `diverged` or not: the causes, in order "positions", "mask", "kernels", and
/// one sentence. Exposed for tests.
void judge_causes(bool diverged, experiment::CauseReport& report);

}  // namespace batchlens::analysis
