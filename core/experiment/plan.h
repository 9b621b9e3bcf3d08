// SPDX-License-Identifier: Apache-2.0
// Planning an experiment: which engines run (the runs of each group and their policies), which
// pairs are compared, what is tapped and what the model's shape makes of the arrays. Plain
// values, torch-free; the runner (runner.cpp) executes a plan group by group.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/experiment/experiment.h"
#include "core/model/loader.h"
#include "core/ops/policy.h"
#include "core/probe/tap_names.h"

namespace batchlens::experiment {

/// One engine of an experiment.
struct PlannedRun {
  std::string id;  ///< "ref", "repeat1", "b2", "wa.ref", "wa.b2", ...
  std::int64_t batch_size = 1;
  RunGroup group = RunGroup::Main;
  ops::OpPolicy policy;
};

/// The engines of one group, stepped together: runs[0] is its B=1 reference.
struct PlannedGroup {
  RunGroup group = RunGroup::Main;
  std::vector<PlannedRun> runs;
};

/// One comparison inside a group, by index into the group's runs.
struct PlannedComparison {
  std::string id;         ///< "ref__b2", "b4.rows"
  std::size_t reference;  ///< index of the reference run
  std::size_t run;        ///< index of the compared run (== reference for Rows)
  ComparisonKind kind = ComparisonKind::Row0;
};

/// The groups of a spec: Main (the B=1 reference, the repeats, each batch size, with the
/// spec's policy), then, when the spec has a workaround, Workaround (the reference and each
/// batch size with ops::combine(policy, workaround), ids prefixed "wa.").
std::vector<PlannedGroup> plan_groups(const ExperimentSpec& spec);

/// The comparisons of a group: its reference against every other run's row under test; in
/// lockstep mode, for batches of identical rows, also each batched run's rows against its own
/// row 0 (a mixed batch's rows hold other prompts: nothing to compare).
std::vector<PlannedComparison> plan_comparisons(const PlannedGroup& group, RunMode mode,
                                                bool mixed = false);

/// What the runs hold at once, for the memory check before loading: a group's engines coexist
/// (its B=1 reference and repeats and every batch), the groups run one after the other. The
/// prompt and new-token counts are left to the front door.
model::Workload workload_of(const ExperimentSpec& spec);

/// How much work a spec is before it runs, for estimates: the decoder steps of every engine
/// (each canvas's denoising steps at most; a canvas that settles early takes fewer) and the
/// batch rows they cover. Groups, repeats and batch sizes as plan_groups; `canvas_length`,
/// `max_denoising_steps` and `max_new_tokens` as the model and its generation config give them.
struct StepCount {
  std::int64_t engine_steps = 0;  ///< decoder passes, all engines
  std::int64_t row_steps = 0;     ///< the same weighted by each engine's batch size
  std::int64_t canvases = 0;      ///< per run
  int steps_per_canvas = 0;       ///< at most
};
StepCount count_steps(const ExperimentSpec& spec, std::int64_t canvas_length,
                      int max_denoising_steps, std::int64_t max_new_tokens);
/// What count_steps needs from a model's files: its canvas length (the preset's, or the
/// checkpoint's config.json) and its generation config before any override (the checkpoint's
/// generation_config.json, or the defaults). Callers that estimate often (the GUI's run panel)
/// read it once per version of the files and keep it.
struct ModelStepFacts {
  std::int64_t canvas_length = 0;
  generation::GenerationConfig generation;
};
/// Reads a model's step facts; no weights. Errors: those of reading the config or the
/// generation config. Never throws.
base::Result<ModelStepFacts> read_step_facts(const model::ModelSource& source);
/// count_steps for `spec` with its model's facts read before (read_step_facts): the generation
/// config with the spec's overrides; reads nothing. Errors: InvalidArgument for overrides the
/// generation config refuses. Never throws.
base::Result<StepCount> count_steps(const ExperimentSpec& spec, const ModelStepFacts& model);
/// count_steps for a spec's model and overrides: read_step_facts, then the overload above.
/// Errors: those of both. Never throws.
base::Result<StepCount> count_steps(const ExperimentSpec& spec);
/// The steps the runs of a finished experiment took (RunResult::steps), weighted as StepCount.
StepCount steps_taken(const ExperimentResult& result);

/// The tapped taps in the order of the T axis: every tap for an empty list, none for {"none"}.
/// The names must be valid (validate()).
std::vector<probe::Tap> planned_taps(const std::vector<std::string>& names);

/// The model's shape as the result arrays see it.
struct Layout {
  std::vector<probe::Tap> taps;  ///< the T axis
  int layers = 0;                ///< L
  std::int64_t c = 0;            ///< canvas length C
  std::int64_t k = 0;            ///< top-k experts
};

}  // namespace batchlens::experiment
