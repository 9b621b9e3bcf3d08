// SPDX-License-Identifier: Apache-2.0
#include "core/experiment/runner.h"

#include <chrono>
#include <memory>

#include <ATen/ATen.h>

#include "core/experiment/comparator.h"
#include "core/experiment/plan.h"
#include "core/experiment/provenance.h"
#include "core/experiment/stepper.h"
#include "core/model/config.h"
#include "core/model/diffusion_gemma.h"

namespace batchlens::experiment {

namespace {

using base::ErrorCode;
using base::take;

// Seconds since `start` on the steady clock.
double since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// What every group of one experiment shares.
struct Context {
  const ExperimentSpec& spec;
  const setup::Session& session;
  const setup::Inputs& inputs;
  const Layout& layout;
  const at::Tensor& prompt;  // [1, L] int64
  const RunControl& control;
  base::ProgressClock clock;
  std::int64_t ticks_done = 0;
};

void check_same_model(const setup::Session& session, const ExperimentSpec& spec) {
  const model::ModelSource& a = session.source;
  const model::ModelSource& b = spec.model;
  const bool same = a.preset == b.preset && a.checkpoint_dir == b.checkpoint_dir &&
                    a.seed == b.seed && session.load.device == spec.load.device &&
                    session.load.dtype == spec.load.dtype &&
                    session.load.experts == spec.load.experts;
  if (!same) {
    base::raise(ErrorCode::InvalidArgument,
                "the experiment names " + b.describe() + " on " + spec.load.device + " (" +
                    spec.load.dtype + ", experts " + spec.load.experts + "); the session holds " +
                    a.describe() + " on " + session.load.device + " (" + session.load.dtype +
                    ", experts " + session.load.experts + ")");
  }
}

// One report per tick: where the group's leader is.
void report_tick(Context& ctx, const std::string& group, const generation::GenerationEngine& lead) {
  ++ctx.ticks_done;
  if (!ctx.control.progress) {
    return;
  }
  ctx.control.progress(ctx.clock.at(
      std::min(ctx.ticks_done, ctx.clock.total()),
      std::string(group == "main" ? "" : "workaround: ") + "canvas " +
          std::to_string(lead.canvas() + 1) + " step " + std::to_string(lead.step_index()) + "/" +
          std::to_string(ctx.inputs.generation.sampler.max_denoising_steps)));
}

// Runs one group's engines to the end, comparing as they go; appends its runs and comparisons
// to `out`.
void run_group(Context& ctx, const PlannedGroup& group, ExperimentResult& out) {
  const ExperimentSpec& spec = ctx.spec;
  generation::GenerateOptions o;
  o.seed = spec.seed;
  o.rng = spec.rng;
  o.prefill = spec.prefill;
  o.config = ctx.inputs.generation;
  o.cancel = ctx.control.cancel;
  o.cuda_graph = ctx.session.load.switches.cuda_graphs;
  const bool lockstep = spec.mode == RunMode::Lockstep;
  // Engines point at their own policy and comparators at engines: neither may move.
  std::vector<std::unique_ptr<Engine>> engines;
  std::vector<Engine*> order;
  for (const PlannedRun& run : group.runs) {
    engines.push_back(
        std::make_unique<Engine>(run, *ctx.session.model, ctx.prompt, o, ctx.layout, lockstep));
    order.push_back(engines.back().get());
  }
  const bool diff_kernel = ctx.session.load.switches.fused_kernel("diff");
  const std::vector<PlannedComparison> planned = plan_comparisons(group, spec.mode);
  std::vector<Comparator> comparators;
  comparators.reserve(planned.size());
  for (const PlannedComparison& p : planned) {
    comparators.emplace_back(p, *engines[p.reference], *engines[p.run], ctx.layout, diff_kernel);
  }
  GroupStepper stepper(order, spec.mode);
  std::int64_t ticks = 0;
  while (!stepper.done()) {
    stepper.begin_canvas();
    while (stepper.tick()) {
      if (ctx.control.cancel != nullptr && ctx.control.cancel->cancelled()) {
        base::raise(ErrorCode::Cancelled, "experiment cancelled");
      }
      const auto compare_start = std::chrono::steady_clock::now();
      for (auto& e : engines) {
        e->record_tick();
      }
      for (Comparator& c : comparators) {
        c.queue_tick();
      }
      out.timings.comparisons_s += since(compare_start);
      ++ticks;
      report_tick(ctx, group.name, stepper.leader().engine());
    }
    stepper.end_canvas();
    // The canvas's per-tick results, read back in one transfer per engine and comparison.
    const auto flush_start = std::chrono::steady_clock::now();
    for (auto& e : engines) {
      e->flush();
    }
    for (Comparator& c : comparators) {
      c.flush();
    }
    out.timings.comparisons_s += since(flush_start);
    out.timings.readback_s += since(flush_start);
  }
  // Results of the group.
  const auto results_start = std::chrono::steady_clock::now();
  std::vector<RunResult> runs;
  for (auto& e : engines) {
    out.timings.engines_s += e->seconds();
    out.provenance.emulated = out.provenance.emulated || e->result().emulated;
    runs.push_back(
        e->finish(ticks, [&](const std::vector<std::int64_t>& tokens, std::int64_t stop) {
          return ctx.inputs.decode_until_stop(tokens, stop);
        }));
  }
  for (std::size_t i = 0; i < comparators.size(); ++i) {
    out.comparisons.push_back(
        comparators[i].finish(ticks, out.taps, runs[planned[i].reference], runs[planned[i].run]));
  }
  for (RunResult& r : runs) {
    out.runs.push_back(std::move(r));
  }
  out.timings.results_s += since(results_start);
}

}  // namespace

base::Result<ExperimentResult> run_experiment(const setup::Session& session,
                                              const ExperimentSpec& spec,
                                              const RunControl& control) {
  return base::guarded([&]() -> ExperimentResult {
    if (auto v = validate(spec); !v.ok()) {
      throw base::ErrorException(v.error());
    }
    check_same_model(session, spec);
    const setup::Inputs in =
        take(session.prepare({spec.prompt, spec.chat_template, spec.prompt_ids}, spec.overrides));
    ExperimentResult out;
    out.spec = spec;
    out.generation_config_json = generation::to_json(in.generation);
    out.prompt_ids = in.prompt_ids;
    out.prompt_text = in.prompt_text;
    out.config_json = session.config_json;
    const model::ModelConfig& config = session.model->config();
    Layout lay;
    lay.layers = static_cast<int>(config.text.num_hidden_layers);
    lay.c = config.canvas_length;
    lay.k = config.text.top_k_experts;
    lay.taps = planned_taps(spec.taps);
    for (const probe::Tap t : lay.taps) {
      out.taps.emplace_back(probe::tap_name(t));
    }
    out.layers = lay.layers;
    out.canvas_length = lay.c;
    out.top_k = lay.k;
    const std::vector<PlannedGroup> groups = plan_groups(spec);
    const at::Tensor prompt =
        at::tensor(out.prompt_ids, at::TensorOptions().dtype(at::kLong)).view({1, -1});
    const std::int64_t canvases = (in.generation.max_new_tokens + lay.c - 1) / lay.c;
    Context ctx{spec,
                session,
                in,
                lay,
                prompt,
                control,
                base::ProgressClock(static_cast<std::int64_t>(groups.size()) * canvases *
                                    in.generation.sampler.max_denoising_steps)};
    for (const PlannedGroup& group : groups) {
      run_group(ctx, group, out);
    }
    out.provenance = provenance_now(session.load, out.provenance.emulated);
    return out;
  });
}

base::Result<ExperimentResult> run_experiment(const ExperimentSpec& spec,
                                              const RunControl& control) {
  return base::guarded([&]() -> ExperimentResult {
    if (auto v = validate(spec); !v.ok()) {
      throw base::ErrorException(v.error());
    }
    model::LoadOptions load = spec.load;
    load.progress = control.load_progress;
    load.cancel = control.cancel;
    load.workload = workload_of(spec);
    const setup::Session session = take(setup::open_session(
        spec.model, load, {spec.prompt, spec.chat_template, spec.prompt_ids}, spec.overrides));
    ExperimentResult out = take(run_experiment(session, spec, control));
    out.timings.load_s = session.load_s;
    return out;
  });
}

}  // namespace batchlens::experiment
