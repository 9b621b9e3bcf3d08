// SPDX-License-Identifier: Apache-2.0
#include "core/experiment/plan.h"

#include <algorithm>

#include "core/model/config.h"
#include "core/setup/front_door.h"

namespace batchlens::experiment {

std::vector<PlannedGroup> plan_groups(const ExperimentSpec& spec) {
  const auto group = [&spec](RunGroup name, const ops::OpPolicy& policy, int repeats) {
    PlannedGroup g{name, {}};
    g.runs.push_back({run_id(name, RunRole::Reference), 1, name, policy});
    for (int r = 1; r <= repeats; ++r) {
      g.runs.push_back({run_id(name, RunRole::Repeat, r), 1, name, policy});
    }
    for (const std::int64_t b : spec.batch_sizes) {
      g.runs.push_back({run_id(name, RunRole::Batched, b), b, name, policy});
    }
    return g;
  };
  std::vector<PlannedGroup> groups{group(RunGroup::Main, spec.policy, spec.repeats)};
  if (spec.workaround) {
    groups.push_back(group(RunGroup::Workaround, ops::combine(spec.policy, *spec.workaround), 0));
  }
  return groups;
}

std::vector<PlannedComparison> plan_comparisons(const PlannedGroup& group, RunMode mode,
                                                bool mixed) {
  std::vector<PlannedComparison> out;
  for (std::size_t i = 1; i < group.runs.size(); ++i) {
    const std::string& run = group.runs[i].id;
    out.push_back(
        {comparison_id(ComparisonKind::Row0, group.runs[0].id, run), 0, i, ComparisonKind::Row0});
    if (mode == RunMode::Lockstep && !mixed && group.runs[i].batch_size > 1) {
      out.push_back({comparison_id(ComparisonKind::Rows, run, run), i, i, ComparisonKind::Rows});
    }
  }
  return out;
}

model::Workload workload_of(const ExperimentSpec& spec) {
  model::Workload w;
  w.rows = 1 + spec.repeats;
  w.max_batch = 1;
  for (const std::int64_t b : spec.batch_sizes) {
    w.rows += b;
    w.max_batch = std::max(w.max_batch, b);
  }
  return w;
}

std::vector<probe::Tap> planned_taps(const std::vector<std::string>& names) {
  std::vector<probe::Tap> taps;
  if (names.empty()) {
    for (const probe::Tap t : probe::all_taps()) {
      taps.push_back(t);
    }
  } else if (!(names.size() == 1 && names[0] == "none")) {
    for (const auto& n : names) {
      taps.push_back(*probe::tap_from_name(n));
    }
  }
  return taps;
}

StepCount count_steps(const ExperimentSpec& spec, std::int64_t canvas_length,
                      int max_denoising_steps, std::int64_t max_new_tokens) {
  StepCount n;
  n.canvases = canvas_length > 0 ? (max_new_tokens + canvas_length - 1) / canvas_length : 0;
  n.steps_per_canvas = max_denoising_steps;
  const std::int64_t per_run = n.canvases * max_denoising_steps;
  for (const PlannedGroup& g : plan_groups(spec)) {
    for (const PlannedRun& r : g.runs) {
      n.engine_steps += per_run;
      n.row_steps += per_run * r.batch_size;
    }
  }
  return n;
}

base::Result<ModelStepFacts> read_step_facts(const model::ModelSource& source) {
  return base::guarded([&]() -> ModelStepFacts {
    ModelStepFacts facts;
    facts.canvas_length =
        base::take(source.checkpoint_dir.empty()
                       ? model::load_preset(source.preset)
                       : model::load_config_file(source.checkpoint_dir / "config.json"))
            .canvas_length;
    facts.generation = base::take(setup::generation_config_for(source, {}));
    return facts;
  });
}

base::Result<StepCount> count_steps(const ExperimentSpec& spec, const ModelStepFacts& model) {
  return base::guarded([&]() -> StepCount {
    const generation::GenerationConfig generation =
        base::take(generation::apply(spec.overrides, model.generation));
    return count_steps(spec, model.canvas_length, generation.sampler.max_denoising_steps,
                       generation.max_new_tokens);
  });
}

base::Result<StepCount> count_steps(const ExperimentSpec& spec) {
  return base::guarded([&]() -> StepCount {
    return base::take(count_steps(spec, base::take(read_step_facts(spec.model))));
  });
}

StepCount steps_taken(const ExperimentResult& result) {
  StepCount n;
  for (const RunResult& r : result.runs) {
    for (const int s : r.steps) {
      n.engine_steps += s;
      n.row_steps += s * r.batch_size;
    }
    n.canvases = std::max<std::int64_t>(n.canvases, static_cast<std::int64_t>(r.steps.size()));
  }
  return n;
}

}  // namespace batchlens::experiment
