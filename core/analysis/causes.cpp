// SPDX-License-Identifier: Apache-2.0
#include "core/analysis/causes.h"

#include <chrono>

#include "core/analysis/culprit.h"
#include "core/probe/tap_names.h"
#include "core/setup/front_door.h"

namespace batchlens::analysis {

using experiment::CauseReport;
using experiment::CauseTrial;
using experiment::ExperimentResult;
using experiment::ExperimentSpec;

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kBatchInvariant = "batch_invariant";
constexpr const char* kPerRow = "per_row";
constexpr const char* kBoth = "per_row+batch_invariant";

const CauseTrial* find_trial(const CauseReport& r, const std::string& name) {
  for (const CauseTrial& t : r.trials) {
    if (t.name == name) {
      return &t;
    }
  }
  return nullptr;
}

}  // namespace

void judge_causes(bool diverged, CauseReport& r) {
  r.causes.clear();
  const CauseTrial* invariant = find_trial(r, kBatchInvariant);
  const CauseTrial* per_row = find_trial(r, kPerRow);
  const CauseTrial* both = find_trial(r, kBoth);
  if (!diverged) {
    r.verdict = "no divergence: the row under test is bitwise B=1's in every batch";
    return;
  }
  if (invariant == nullptr || per_row == nullptr || both == nullptr) {
    r.verdict = "the causes were not separated (the re-runs did not run)";
    return;
  }
  // With every op batch-invariant, a difference is the batch's layout, not its kernels.
  const bool layout = invariant->diverges;
  if (layout && !both->diverges) {
    r.causes.emplace_back("positions");
  }
  if (both->diverges) {
    r.causes.emplace_back("mask");
  }
  // The kernels matter where batch-invariant ops remove a difference that the same positions
  // leave: without the layout (no batch-invariant difference), or with per-row positions.
  if ((!layout) || (per_row->diverges && !both->diverges)) {
    r.causes.emplace_back("kernels");
  }
  std::string v;
  for (const std::string& c : r.causes) {
    if (c == "positions") {
      v += "the positions: with every op batch-invariant the row still differs, and with "
           "per-row positions it does not (transformers' shared position ids shift it)";
    } else if (c == "mask") {
      v += std::string(v.empty() ? "" : "; ") +
           "the padding: with per-row positions and every op batch-invariant the row still "
           "differs (its attention reduces over masked padding slots)";
    } else {
      v += std::string(v.empty() ? "" : "; ") +
           "the kernels: every op batch-invariant makes the row B=1's" +
           (layout ? std::string(" once the positions are per-row") : std::string()) +
           " (the culprit finder names which op)";
    }
  }
  r.verdict = "caused by " + v;
}

base::Result<CauseReport> find_causes(const setup::Session& session, const ExperimentResult& shown,
                                      const experiment::RunControl& control) {
  return base::guarded([&]() -> CauseReport {
    const ExperimentSpec& spec = shown.spec;
    if (!spec.composition.mixed()) {
      base::raise(base::ErrorCode::InvalidArgument,
                  "the causes are told apart for a batch of different prompts: the experiment "
                  "has no companions");
    }
    const auto start = Clock::now();
    CauseReport report = shown.causes.value_or(CauseReport{});
    report.trials.clear();
    const ops::OpPolicy invariant = ops::combine(spec.policy, ops::OpPolicy::batch_invariant_all());
    struct Plan {
      const char* name;
      const ops::OpPolicy* policy;
      generation::PositionMode positions;
    };
    const Plan plans[] = {{kBatchInvariant, &invariant, spec.composition.positions},
                          {kPerRow, &spec.policy, generation::PositionMode::PerRow},
                          {kBoth, &invariant, generation::PositionMode::PerRow}};
    int index = 0;
    for (const Plan& plan : plans) {
      ++index;
      CauseTrial t;
      t.name = plan.name;
      t.policy = ops::policy_text(*plan.policy);
      t.positions = generation::name(plan.positions);
      ExperimentSpec s = spec;
      s.workaround.reset();
      s.repeats = 0;
      s.kernels = false;
      s.taps = {std::string(probe::tap_name(probe::Tap::Logits))};
      s.policy = *plan.policy;
      s.composition.positions = plan.positions;
      experiment::RunControl rc;
      rc.cancel = control.cancel;
      rc.stop_at_first_difference = true;
      rc.cuda_graphs = false;
      if (control.progress) {
        rc.progress = [&](const base::Progress& p) {
          base::Progress q = p;
          q.stage =
              "causes: re-run " + std::to_string(index) + " of 3 (" + t.name + "): " + p.stage;
          control.progress(q);
        };
      }
      const auto trial_start = Clock::now();
      const ExperimentResult r = base::take(experiment::run_experiment(session, s, rc));
      const TrialOutcome o = trial_outcome(r);
      t.diverges = !o.identical;
      t.first = o.identical ? std::string() : o.where();
      t.wall_s = std::chrono::duration<double>(Clock::now() - trial_start).count();
      report.trials.push_back(std::move(t));
    }
    judge_causes(!trial_outcome(shown).identical, report);
    report.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
    return report;
  });
}

}  // namespace batchlens::analysis
