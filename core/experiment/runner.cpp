// SPDX-License-Identifier: Apache-2.0
#include "core/experiment/runner.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <set>

#include <ATen/ATen.h>

#include "core/base/input.h"
#include "core/experiment/comparator.h"
#include "core/experiment/kernel_capture.h"
#include "core/experiment/plan.h"
#include "core/experiment/provenance.h"
#include "core/experiment/stepper.h"
#include "core/generation/engine.h"
#include "core/model/config.h"
#include "core/model/diffusion_gemma.h"
#include "core/ops/op_observer.h"
#include "core/setup/engine_pass.h"

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
  // The companions' ids (spec.composition), empty for identical rows.
  const std::vector<std::vector<std::int64_t>>& companion_ids;
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
void report_tick(Context& ctx, RunGroup group, const generation::GenerationEngine& lead) {
  ++ctx.ticks_done;
  if (!ctx.control.progress) {
    return;
  }
  ctx.control.progress(ctx.clock.at(
      std::min(ctx.ticks_done, ctx.clock.total()),
      std::string(group == RunGroup::Main ? "" : "workaround: ") + "canvas " +
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
  o.cuda_graph = ctx.session.load.switches.cuda_graphs && ctx.control.cuda_graphs;
  o.positions = spec.composition.positions;
  const bool lockstep = spec.mode == RunMode::Lockstep;
  const bool mixed = !ctx.companion_ids.empty();
  // Engines point at their own policy and comparators at engines: neither may move.
  std::vector<std::unique_ptr<Engine>> engines;
  std::vector<Engine*> order;
  for (const PlannedRun& run : group.runs) {
    RunRows rows{&ctx.prompt, nullptr, spec.composition.row};
    generation::PaddedPrompts padded;
    if (mixed && run.batch_size > 1) {
      padded = generation::pad_left(generation::batch_rows(ctx.inputs.prompt_ids, ctx.companion_ids,
                                                           run.batch_size, spec.composition.row),
                                    ctx.session.model->config().text.pad_token_id);
      rows.mixed = &padded;
    }
    engines.push_back(
        std::make_unique<Engine>(run, *ctx.session.model, rows, o, ctx.layout, lockstep));
    order.push_back(engines.back().get());
  }
  const bool diff_kernel = ctx.session.load.switches.fused_kernel("diff");
  const std::vector<PlannedComparison> planned = plan_comparisons(group, spec.mode, mixed);
  std::vector<Comparator> comparators;
  comparators.reserve(planned.size());
  for (const PlannedComparison& p : planned) {
    comparators.emplace_back(p, *engines[p.reference], *engines[p.run], ctx.layout, diff_kernel);
  }
  GroupStepper stepper(order, spec.mode);
  std::int64_t ticks = 0;
  bool differs = false;  // stop_at_first_difference: row 0 of a batched run left B=1's
  const std::int64_t horizon = ctx.control.stop_after_ticks;
  // The group stops part-way: at the first difference, or at the horizon of ticks.
  const auto stopped = [&] {
    return differs || (horizon > 0 && ticks >= horizon);
  };
  while (!stepper.done() && !stopped()) {
    stepper.begin_canvas();
    while (!stopped() && stepper.tick()) {
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
      report_tick(ctx, group.group, stepper.leader().engine());
      if (ctx.control.stop_at_first_difference) {
        for (auto& e : engines) {
          e->flush();
        }
        for (Comparator& c : comparators) {
          c.flush();
          differs = differs || c.differs_so_far();
        }
      }
    }
    if (!stopped()) {
      stepper.end_canvas();
    }
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

// An experiment prepared against a session: its inputs, the model's layout and the result's
// header (spec, configs, prompt, taps, shape), before any group runs.
struct Prepared {
  setup::Inputs inputs;
  std::vector<std::vector<std::int64_t>> companion_ids;  // spec.composition's, tokenized
  Layout layout;
  ExperimentResult header;
};

// Validates `spec` for `session` and prepares its prompt and overrides there. `prompt_ids`, when
// not empty, are the ids to run instead of the spec's prompt (a shown experiment's, as it ran).
Prepared prepare_experiment(const setup::Session& session, const ExperimentSpec& spec,
                            const std::vector<std::int64_t>& prompt_ids = {}) {
  if (auto v = validate(spec); !v.ok()) {
    throw base::ErrorException(v.error());
  }
  check_same_model(session, spec);
  Prepared p;
  p.inputs = take(session.prepare(
      {spec.prompt, spec.chat_template, prompt_ids.empty() ? spec.prompt_ids : prompt_ids},
      spec.overrides));
  // Every companion, before any work: a bad one is refused with its number.
  p.companion_ids =
      take(session.prepare_companions(spec.composition.companions, p.inputs, spec.overrides));
  ExperimentResult& out = p.header;
  out.spec = spec;
  out.generation_config_json = generation::to_json(p.inputs.generation);
  out.prompt_ids = p.inputs.prompt_ids;
  out.prompt_text = p.inputs.prompt_text;
  out.config_json = session.config_json;
  const model::ModelConfig& config = session.model->config();
  Layout& lay = p.layout;
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
  return p;
}

// The row under test's layout in every batched run of `groups` (issue #35), replacing what
// `out` held for those runs.
void record_layouts(const ExperimentSpec& spec, const Prepared& p,
                    const std::vector<PlannedGroup>& groups, ExperimentResult& out) {
  if (!out.causes) {
    out.causes.emplace();
  }
  std::vector<RowLayout>& rows = out.causes->rows;
  const auto tokens = static_cast<std::int64_t>(p.header.prompt_ids.size());
  for (const PlannedGroup& g : groups) {
    for (const PlannedRun& run : g.runs) {
      if (run.batch_size < 2) {
        continue;
      }
      rows.erase(std::remove_if(rows.begin(), rows.end(),
                                [&](const RowLayout& r) { return r.run == run.id; }),
                 rows.end());
      std::int64_t longest = 0;
      for (const auto& row : generation::batch_rows(p.header.prompt_ids, p.companion_ids,
                                                    run.batch_size, spec.composition.row)) {
        longest = std::max(longest, static_cast<std::int64_t>(row.size()));
      }
      const std::int64_t pad = longest - tokens;
      rows.push_back({run.id, run.batch_size, pad,
                      spec.composition.positions == generation::PositionMode::Shared ? pad : 0,
                      tokens, longest});
    }
  }
}

// Runs `groups` of `spec` one after the other, appending their runs and comparisons to `out`.
void run_groups(const setup::Session& session, const ExperimentSpec& spec, const Prepared& p,
                const std::vector<PlannedGroup>& groups, const RunControl& control,
                ExperimentResult& out) {
  const at::Tensor prompt =
      at::tensor(p.header.prompt_ids, at::TensorOptions().dtype(at::kLong)).view({1, -1});
  const std::int64_t canvases = (p.inputs.generation.max_new_tokens + p.layout.c - 1) / p.layout.c;
  Context ctx{spec,
              session,
              p.inputs,
              p.layout,
              prompt,
              p.companion_ids,
              control,
              base::ProgressClock(static_cast<std::int64_t>(groups.size()) * canvases *
                                  p.inputs.generation.sampler.max_denoising_steps)};
  for (const PlannedGroup& group : groups) {
    // Each group's engines capture their CUDA graphs into pools of their own: what earlier
    // groups (or experiments of this session: a sweep's items) left cached goes back first.
    setup::release_cached_device_memory(session.model->device());
    run_group(ctx, group, out);
  }
  if (!p.companion_ids.empty()) {
    record_layouts(spec, p, groups, out);
  }
  if (spec.kernels) {
    // Apart from the engines above (fresh passes), so it cannot change what they computed.
    if (control.progress) {
      control.progress(ctx.clock.at(ctx.clock.total(), "recording each engine's kernels"));
    }
    KernelProvenance k = capture_kernels(session, spec, p.header.prompt_ids, p.companion_ids,
                                         groups, control.cancel);
    if (!out.kernels) {
      out.kernels = KernelProvenance{k.source, {}, 0.0};
    }
    std::set<std::string> ids;
    for (const PlannedGroup& g : groups) {
      for (const PlannedRun& r : g.runs) {
        ids.insert(r.id);
      }
    }
    auto& engines = out.kernels->engines;
    engines.erase(std::remove_if(engines.begin(), engines.end(),
                                 [&](const EngineKernels& e) { return ids.count(e.run) > 0; }),
                  engines.end());
    for (EngineKernels& e : k.engines) {
      engines.push_back(std::move(e));
    }
    out.kernels->wall_s += k.wall_s;
    out.timings.kernels_s += k.wall_s;
  }
}

// JSON texts equal as documents (key order and spacing aside); false when either is malformed.
bool same_json(const std::string& a, const std::string& b) {
  if (a == b) {
    return true;
  }
  const auto x = nlohmann::json::parse(a, nullptr, false);
  const auto y = nlohmann::json::parse(b, nullptr, false);
  return !x.is_discarded() && !y.is_discarded() && x == y;
}

// The provenance of runs computed on `session` now.
Provenance session_provenance(const setup::Session& session, bool emulated) {
  Provenance p = provenance_now(session.load, emulated);
  if (session.model && session.model->fused_kernels().cpu_gemm) {
    p.cpu.bf16_matmul += " (BatchLens's CPU GEMM, checked bitwise at load)";
  }
  return p;
}

// Refuses to extend `shown` with runs whose arrays or inputs would not match its own: another
// model config, generation config, prompt, tap list or shape here.
void check_extends(const ExperimentResult& shown, const ExperimentResult& here) {
  const auto refuse = [](const std::string& what) {
    base::raise(ErrorCode::InvalidArgument,
                "the shown experiment cannot be extended here: its " + what +
                    " differs from what this model gives; run the whole experiment again");
  };
  if (!same_json(shown.config_json, here.config_json)) {
    refuse("model config");
  }
  if (!same_json(shown.generation_config_json, here.generation_config_json)) {
    refuse("generation config");
  }
  if (shown.prompt_ids != here.prompt_ids) {
    refuse("prompt");
  }
  if (shown.taps != here.taps || shown.layers != here.layers ||
      shown.canvas_length != here.canvas_length || shown.top_k != here.top_k) {
    refuse("tap list or model shape");
  }
}

bool in_workaround_group(const RunResult& run) {
  return run.group == RunGroup::Workaround;
}

bool of_workaround_group(const ComparisonResult& c) {
  return group_of_comparison(c.id) == RunGroup::Workaround;
}

// Validates `spec` and opens a session for it (the memory check sized for its runs), with
// `prompt_ids` as the prompt when not empty.
setup::Session open_for(const ExperimentSpec& spec, const std::vector<std::int64_t>& prompt_ids,
                        const RunControl& control) {
  if (auto v = validate(spec); !v.ok()) {
    throw base::ErrorException(v.error());
  }
  model::LoadOptions load = spec.load;
  load.progress = control.load_progress;
  load.cancel = control.cancel;
  load.workload = workload_of(spec);
  return take(setup::open_session(spec.model, load, {spec.prompt, spec.chat_template, prompt_ids},
                                  spec.overrides));
}

}  // namespace

std::vector<std::string> extension_mismatches(const ExperimentResult& shown,
                                              const Provenance& here) {
  std::vector<std::string> out = provenance_mismatches(shown.provenance, here);
  // The shown runs' policies as they ran against this build's: an emulation profile is stored
  // by name, and the runs added here must emulate what the shown ones did. The main group's
  // runs share the spec's policy: the first one that differs says it.
  for (const PlannedGroup& g : plan_groups(shown.spec)) {
    for (const PlannedRun& planned : g.runs) {
      const RunResult* ran = shown.run(planned.id);
      if (ran != nullptr && ran->group == RunGroup::Main &&
          !same_json(ran->policy_json, base::dump_json_lossy(ops::to_json(planned.policy)))) {
        out.push_back("policy " + ops::policy_text(planned.policy) + " " + ran->policy_text +
                      " there, " + ops::describe(planned.policy) + " here");
        return out;
      }
    }
  }
  return out;
}

base::Result<ExperimentResult> run_experiment(const setup::Session& session,
                                              const ExperimentSpec& spec,
                                              const RunControl& control) {
  return base::guarded([&]() -> ExperimentResult {
    const Prepared p = prepare_experiment(session, spec);
    ExperimentResult out = p.header;
    run_groups(session, spec, p, plan_groups(spec), control, out);
    out.provenance = session_provenance(session, out.provenance.emulated);
    return out;
  });
}

base::Result<ExperimentResult> run_workaround_group(const setup::Session& session,
                                                    const ExperimentResult& shown,
                                                    const ops::OpPolicy& workaround,
                                                    const RunControl& control) {
  return base::guarded([&]() -> ExperimentResult {
    ExperimentSpec spec = shown.spec;
    spec.workaround = workaround;
    spec.kernels = shown.kernels.has_value();  // the added runs recorded as the shown ones were
    const Prepared p = prepare_experiment(session, spec, shown.prompt_ids);
    check_extends(shown, p.header);
    if (const auto differences = extension_mismatches(shown, session_provenance(session, false));
        !differences.empty()) {
      std::string list;
      for (const std::string& d : differences) {
        list += (list.empty() ? "" : "; ") + d;
      }
      base::raise(ErrorCode::InvalidArgument,
                  "the shown experiment cannot be extended here: workaround runs computed here "
                  "would not be comparable with its runs (" +
                      list +
                      "); run the whole experiment again here, or add the workaround where it "
                      "was recorded");
    }
    std::vector<PlannedGroup> groups = plan_groups(spec);
    groups.erase(
        std::remove_if(groups.begin(), groups.end(),
                       [](const PlannedGroup& g) { return g.group != RunGroup::Workaround; }),
        groups.end());
    ExperimentResult out = shown;
    out.spec = spec;
    out.timings = {};
    out.runs.erase(std::remove_if(out.runs.begin(), out.runs.end(), in_workaround_group),
                   out.runs.end());
    out.comparisons.erase(
        std::remove_if(out.comparisons.begin(), out.comparisons.end(), of_workaround_group),
        out.comparisons.end());
    run_groups(session, spec, p, groups, control, out);
    // The shown experiment's provenance stays; the emulation flag covers every run now held.
    out.provenance.emulated = std::any_of(out.runs.begin(), out.runs.end(),
                                          [](const RunResult& r) { return r.emulated; });
    return out;
  });
}

namespace {

// Passes calls on to `inner` only while on (one decoder pass of a run).
class GatedObserver final : public ops::OpObserver {
 public:
  explicit GatedObserver(ops::OpObserver& inner) : inner_(inner) {}
  bool on = false;
  void on_op(const ops::OpCall& call) override {
    if (on) {
      inner_.on_op(call);
    }
  }
  bool wants_inputs(ops::OpFamily family, int layer) const override {
    return on && inner_.wants_inputs(family, layer);
  }
  void on_inputs(const ops::OpCall& call, std::initializer_list<at::Tensor> inputs) override {
    inner_.on_inputs(call, inputs);
  }

 private:
  ops::OpObserver& inner_;
};

}  // namespace

base::Result<void> observe_reference_step(const setup::Session& session,
                                          const ExperimentResult& shown, RunGroup group, int canvas,
                                          int step, ops::OpObserver& observer,
                                          const RunControl& control) {
  return base::guarded([&] {
    const ExperimentSpec& spec = shown.spec;
    const Prepared p = prepare_experiment(session, spec, shown.prompt_ids);
    const std::vector<PlannedGroup> groups = plan_groups(spec);
    const auto g = std::find_if(groups.begin(), groups.end(),
                                [&](const PlannedGroup& x) { return x.group == group; });
    if (g == groups.end() || g->runs.empty()) {
      base::raise(ErrorCode::InvalidArgument,
                  "the experiment has no " + std::string(name(group)) + " group");
    }
    const PlannedRun& ref = g->runs.front();
    GatedObserver gate(observer);
    generation::GenerateOptions o;
    o.seed = spec.seed;
    o.rng = spec.rng;
    o.prefill = spec.prefill;
    o.config = p.inputs.generation;
    o.cancel = control.cancel;
    o.cuda_graph = false;
    o.batch_size = ref.batch_size;
    o.policy = &ref.policy;
    o.observer = &gate;
    const at::Tensor prompt =
        at::tensor(p.header.prompt_ids, at::TensorOptions().dtype(at::kLong)).view({1, -1});
    generation::GenerationEngine engine(*session.model, prompt, o);
    const std::int64_t total =
        std::max(1, (canvas * p.inputs.generation.sampler.max_denoising_steps) + step);
    base::ProgressClock clock(total);
    std::int64_t done = 0;
    while (!engine.done()) {
      engine.begin_canvas();
      while (!engine.canvas_done()) {
        if (control.cancel != nullptr && control.cancel->cancelled()) {
          base::raise(ErrorCode::Cancelled, "cancelled");
        }
        gate.on = engine.canvas() == canvas && engine.step_index() + 1 == step;
        (void)engine.step();
        ++done;
        if (control.progress) {
          control.progress(
              clock.at(std::min(done, total), "run " + ref.id + ": canvas " +
                                                  std::to_string(engine.canvas() + 1) + " step " +
                                                  std::to_string(engine.step_index())));
        }
        if (gate.on) {
          return;
        }
      }
      if (engine.canvas() >= canvas) {
        break;
      }
      engine.end_canvas();
    }
    base::raise(ErrorCode::InvalidArgument, "run " + ref.id + " never reaches canvas " +
                                                std::to_string(canvas + 1) + " step " +
                                                std::to_string(step));
  });
}

base::Result<setup::Session> open_session_for(const ExperimentSpec& spec,
                                              const RunControl& control) {
  return base::guarded([&] { return open_for(spec, spec.prompt_ids, control); });
}

base::Result<ExperimentResult> run_experiment(const ExperimentSpec& spec,
                                              const RunControl& control) {
  return base::guarded([&]() -> ExperimentResult {
    const setup::Session session = open_for(spec, spec.prompt_ids, control);
    ExperimentResult out = take(run_experiment(session, spec, control));
    out.timings.load_s = session.load_s;
    out.timings.prepare_s = session.prepare_s;
    return out;
  });
}

base::Result<ExperimentResult> run_workaround_group(const ExperimentResult& shown,
                                                    const ops::OpPolicy& workaround,
                                                    const RunControl& control) {
  return base::guarded([&]() -> ExperimentResult {
    ExperimentSpec spec = shown.spec;
    spec.workaround = workaround;
    spec.kernels = shown.kernels.has_value();  // the added runs recorded as the shown ones were
    const setup::Session session =
        open_for(spec, shown.prompt_ids.empty() ? spec.prompt_ids : shown.prompt_ids, control);
    ExperimentResult out = take(run_workaround_group(session, shown, workaround, control));
    out.timings.load_s = session.load_s;
    out.timings.prepare_s = session.prepare_s;
    return out;
  });
}

}  // namespace batchlens::experiment
