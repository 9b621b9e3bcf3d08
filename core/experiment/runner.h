// SPDX-License-Identifier: Apache-2.0
// Running experiments: a plan (plan.h) executed group by group, its engines stepped together
// (stepper.h) and compared on the device as they go (comparator.h). Load a model once with
// setup::open_model and run many experiments or trials against it (other policies, prompts,
// seeds, batch sizes): the culprit finder and sweeps do. Torch-free header.
#pragma once

#include <string>
#include <vector>

#include "core/base/cancel.h"
#include "core/base/error.h"
#include "core/base/progress.h"
#include "core/experiment/experiment.h"
#include "core/ops/policy.h"
#include "core/setup/front_door.h"

namespace batchlens::ops {
class OpObserver;
}

namespace batchlens::experiment {

/// Progress and cancellation of a run.
struct RunControl {
  const base::CancelToken* cancel = nullptr;
  base::ProgressFn progress;       ///< one report per tick
  base::ProgressFn load_progress;  ///< weights being loaded (run_experiment(spec) only)
  /// Stop a group at the first tick where row 0 of a batched run differs from B=1 (the culprit
  /// finder's trials, which need only whether and where): the result then ends at that tick and
  /// its runs' texts are those of an unfinished generation. Costs one readback per tick.
  bool stop_at_first_difference = false;
  /// > 0: a group stops after this many ticks, its result ending there as with
  /// stop_at_first_difference (the culprit finder's light trials, which watch the first ticks,
  /// where every op family has run at every shape of the canvas, and verify the answer on the
  /// whole generation afterwards).
  std::int64_t stop_after_ticks = 0;
  /// false: every engine runs eager even where the session captures CUDA graphs (the culprit
  /// finder's trials: most stop after a few ticks, where a capture per engine would cost more
  /// than it saves, and each trial's engines would hold their graphs' memory).
  bool cuda_graphs = true;
};

/// Runs `spec` on an open session without loading anything: builds one generation engine per
/// run (the B=1 reference, the B=1 repeats, each batch size; then the same with the workaround
/// policy), steps each group's engines together one denoising step at a time and compares their
/// taps on the device as they go. The spec's model and load options (device, dtype, experts) must
/// be the session's; its prompt and generation overrides are prepared against the session
/// (Session::prepare). timings.load_s is 0. Errors: InvalidArgument (spec, or a spec for another
/// model), those of preparing the prompt, OutOfMemory, Cancelled. Never throws.
base::Result<ExperimentResult> run_experiment(const setup::Session& session,
                                              const ExperimentSpec& spec,
                                              const RunControl& control = {});

/// Why runs added to `shown` here (run_workaround_group) would not be comparable with its own:
/// provenance_mismatches(shown.provenance, here) (device, LibTorch, GPU software or the CPU's
/// kernels), and main runs of `shown` whose policy this build defines otherwise (an emulation
/// profile whose emulated families changed: the added runs would emulate something else). One
/// phrase per difference; empty when runs computed with `here` can join `shown`. `here` is
/// provenance_now (or provenance_of) for `shown`'s device and dtype. Never throws.
std::vector<std::string> extension_mismatches(const ExperimentResult& shown,
                                              const Provenance& here);

/// Runs only the workaround group of `shown` (an experiment run without it, or with another
/// workaround) and returns `shown` with it: its spec's workaround set to `workaround`, its old
/// "workaround" runs and "wa." comparisons replaced by those of `workaround`, run with the shown
/// experiment's own settings (spec, prompt ids as it ran) on `session`. A group's ticks and
/// arrays are its own, so the result equals running the whole spec with the workaround at once
/// (bar timings and wall times). A file has one provenance for all its runs, so the added runs
/// must be computed where the shown ones were: the shown provenance stays (the emulation flag
/// covers every run); timings are this run's. Errors: InvalidArgument when `shown` names another
/// model, device, dtype or experts than the session's, or its model config, generation config,
/// prompt, taps or shape differ from what the session gives, or it was recorded with another
/// LibTorch, GPU software or CPU kernels, or with another definition of its policy
/// (extension_mismatches; the message names each difference); those of run_experiment. Never
/// throws.
base::Result<ExperimentResult> run_workaround_group(const setup::Session& session,
                                                    const ExperimentResult& shown,
                                                    const ops::OpPolicy& workaround,
                                                    const RunControl& control = {});

/// Opens a session for `shown`'s spec (as run_experiment(spec) does) and runs its workaround
/// group there. Errors: those of open_session and of the overload above.
base::Result<ExperimentResult> run_workaround_group(const ExperimentResult& shown,
                                                    const ops::OpPolicy& workaround,
                                                    const RunControl& control = {});

/// Validates `spec` and opens a session for it (setup::open_session, the memory check sized for
/// the spec's runs, the spec's prompt ids or prompt). Errors: those of validate and
/// open_session. Never throws.
base::Result<setup::Session> open_session_for(const ExperimentSpec& spec,
                                              const RunControl& control = {});

/// Runs the B=1 reference of `shown`'s group `group` alone on
/// `session`, eager, with the shown experiment's settings (spec, prompt ids as it ran), until
/// its decoder pass of `step` (1-based) of canvas `canvas` (0-based) has run; `observer` hears
/// the op calls of that pass only (ops::OpObserver, on_inputs included). The reference leads
/// its group in every mode, so this pass computes what the experiment's reference computed.
/// Errors: InvalidArgument when `shown` names another model than the session's, has no such
/// group, or its reference finished before that step; Cancelled; OutOfMemory. Never throws.
base::Result<void> observe_reference_step(const setup::Session& session,
                                          const ExperimentResult& shown, RunGroup group, int canvas,
                                          int step, ops::OpObserver& observer,
                                          const RunControl& control = {});

/// Opens a session for `spec` (setup::open_session, the memory check sized for the spec's
/// runs) and runs it there. Errors: those of open_session and of the overload above.
base::Result<ExperimentResult> run_experiment(const ExperimentSpec& spec,
                                              const RunControl& control = {});

}  // namespace batchlens::experiment
