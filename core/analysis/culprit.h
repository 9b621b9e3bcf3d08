// SPDX-License-Identifier: Apache-2.0
// The culprit finder: which op families, at least, must change (row-wise or batch-invariant) for
// row 0 of every batch size to be bitwise B=1's at every step and tap, and what that fix costs.
// Greedy from the first divergence, then 1-minimal, then each family's layer range narrowed,
// then confirmed in free mode over the whole generation. Trials share one loaded model.
// Torch-free header.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/experiment/culprit_report.h"
#include "core/experiment/experiment.h"
#include "core/experiment/runner.h"
#include "core/ops/policy.h"

namespace batchlens::setup {
struct Session;
}

namespace batchlens::analysis {

/// Whether a trial's batches leave B=1, and where first: the main group's comparisons of each
/// batch's row under test (repeats aside). The culprit finder's and the causes' trials read it.
struct TrialOutcome {
  bool identical = false;
  experiment::Divergence first;
  std::string comparison;  ///< of the earliest divergence
  /// "ref__b2 canvas 1 step 3 attn.q layer 0", or "ref__b2: tokens" when only the text differs.
  std::string where() const;
};
TrialOutcome trial_outcome(const experiment::ExperimentResult& r);

struct CulpritOptions {
  ops::Strategy strategy = ops::Strategy::RowWise;  ///< RowWise or BatchInvariant
  bool lockstep_trials = true;  ///< search and minimise in lockstep (fast); confirm is free
  bool narrow_layers = true;
  /// Fewer trials for the same answer (issue #37). Minimising drops families in groups (one
  /// identical trial, a whole run, drops many; a group that diverges, a trial that stops at its
  /// first difference, is halved). Narrowing uses where each trial diverged: a trial that
  /// diverges at layer l in the first step, below the layers it fixed, rules out every first
  /// layer above l at once (exact: nothing at or before that point depends on the fix of later
  /// layers); a fix needed from layer 0 is asked first whether it is needed in the last layer.
  /// Under the search's own assumption (a fix still holds with more fixed) the set and ranges
  /// are those of the one-by-one search. False: that search.
  bool fewer_trials = true;
  /// The ticks each greedy search trial and each light trial (minimise and narrow, logits only)
  /// watches before it stops: -1 chosen from where the trials so far diverged (fewer_trials; none
  /// without), 0 every tick, N the first N. An answer is always verified on the whole
  /// generation; a horizon too short for it costs a second search without one.
  std::int64_t horizon_ticks = -1;
  int cost_repeats = 5;  ///< decoder passes timed per batch size and policy; 0: no costs
};

/// Whether fixing only `kept` (each with its range) leaves every batch size identical: a trial.
using KeepsIdentical = std::function<bool(const std::vector<ops::OpFamily>& kept)>;

/// The families, of those the greedy search added (`added`: per search trial, in order), that a
/// 1-minimal fix keeps: each dropped in turn and left out while `keeps_identical` holds, never
/// the last. The finder's minimising step without groups.
std::vector<ops::OpFamily> minimal_families_one_by_one(
    const std::vector<std::vector<ops::OpFamily>>& added, const KeepsIdentical& keeps_identical);

/// Groups of at least this many families (every family left, added at once) are tried whole.
inline constexpr std::size_t kDropGroupFrom = 4;

/// The same with large groups tried whole and halved when they diverge (issue #37: a trial that
/// stays identical is a whole run, one that diverges stops early). When `keeps_identical` is
/// monotone (a superset of a set that holds holds), the same families as one by one, with no
/// more calls that return true. Never throws unless `keeps_identical` does.
std::vector<ops::OpFamily> minimal_families(const std::vector<std::vector<ops::OpFamily>>& added,
                                            const KeepsIdentical& keeps_identical);

/// Runs the finder for `spec` on `session` (its model, device and precision). The spec's
/// policy (e.g. an emulation profile) stays under every trial; its workaround is ignored.
/// Errors: those of run_experiment (Cancelled included), InvalidArgument for a strategy other
/// than row_wise and batch_invariant. Never throws.
base::Result<experiment::CulpritReport> find_culprit(const setup::Session& session,
                                                     const experiment::ExperimentSpec& spec,
                                                     const CulpritOptions& options = {},
                                                     const experiment::RunControl& control = {});

/// Opens a session for `spec` (as run_experiment(spec) does), finds the culprit, then runs
/// `spec` once more in its own mode with the minimal fix as its workaround (when one was found)
/// and returns that experiment with the report in `culprit`: one file shows the divergence,
/// the fix and the finder's trials. Errors: those of open_session, find_culprit, run_experiment.
base::Result<experiment::ExperimentResult> run_culprit_experiment(
    const experiment::ExperimentSpec& spec, const CulpritOptions& options = {},
    const experiment::RunControl& control = {});

}  // namespace batchlens::analysis
