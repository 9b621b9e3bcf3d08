// SPDX-License-Identifier: Apache-2.0
// The experiment runner: engines of one group stepped together, taps compared on the device.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <limits>
#include <map>
#include <memory>
#include <numeric>

#include <ATen/ATen.h>

#include "core/base/system_info.h"
#include "core/base/version.h"
#include "core/experiment/experiment.h"
#include "core/model/config.h"
#include "core/model/diffusion_gemma.h"
#include "core/ops/policy.h"
#include "core/probe/metrics.h"
#include "core/sampling/generate.h"
#include "core/setup/front_door.h"

namespace batchlens::experiment {

namespace {

using base::take;

using base::ErrorCode;
using probe::Tap;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Seconds since `start` on the steady clock.
double since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Keeps this step's tapped tensors (clones: the model may reuse its buffers; a graph replay's
// tap copies stay as they are until the next replay, and the comparisons that read them are
// queued on the same stream before it).
class StepTaps final : public probe::TapSink {
 public:
  explicit StepTaps(std::bitset<probe::kTapCount> wanted) : wanted_(wanted) {}
  bool wants(Tap tap, int /*layer*/) const override {
    return wanted_.test(static_cast<std::size_t>(tap));
  }
  // Row 0 is all the row-0 comparisons read; a batched lockstep run also compares its rows.
  bool first_row_only() const override { return first_row_only_; }
  void set_first_row_only(bool first) { first_row_only_ = first; }
  void record(Tap tap, int layer, const at::Tensor& value) override {
    const bool first = first_row_only_ && value.dim() > 0;
    taps_[{tap, layer}] = (first ? value.narrow(0, 0, 1) : value).detach().clone();
  }
  void record_stable(Tap tap, int layer, const at::Tensor& value) override {
    taps_[{tap, layer}] = value.detach();
  }
  at::Tensor get(Tap tap, int layer) const {
    const auto it = taps_.find({tap, layer});
    return it == taps_.end() ? at::Tensor() : it->second;
  }
  void clear() { taps_.clear(); }

 private:
  std::bitset<probe::kTapCount> wanted_;
  bool first_row_only_ = false;
  std::map<std::pair<Tap, int>, at::Tensor> taps_;
};

struct Engine {
  RunResult result;
  std::unique_ptr<ops::OpPolicy> policy;
  std::unique_ptr<sampling::GenerationEngine> engine;
  StepTaps taps;
  sampling::StepTensors last;  // this tick's step (when stepped)
  bool stepped = false;        // in the current tick
  double seconds = 0;
  // Row-0 per-tick data, appended; a stepped tick's values arrive at the end of the canvas.
  std::vector<std::int64_t> canvas_in, argmax, sampled;
  std::vector<std::uint8_t> accepted;
  std::vector<float> entropy;
  // Per stepped tick: where its values go, and [5, C] fp64 on the device (canvas_in, argmax,
  // sampled, accepted, entropy: exact in fp64).
  std::vector<std::pair<std::size_t, at::Tensor>> pending;
  explicit Engine(std::bitset<probe::kTapCount> wanted) : taps(wanted) {}
};

// One tick of one comparison, computed on the device and read back once per canvas (flush):
// no host synchronisation in the step loop.
struct PendingTick {
  std::size_t base = 0;                                      // aggregates [L+1, T]
  std::size_t pbase = 0;                                     // per position [L+1, T, C]
  std::size_t lbase = 0;                                     // routing [L, C]
  std::size_t sbase = 0;                                     // sampler [C]
  std::vector<std::pair<std::int64_t, std::int64_t>> where;  // (slot, tap) per diff row
  at::Tensor diff;                                           // row0: [n, 3, C]; rows: [n, 3]
  bool sampler = false;  // compare the engines' sampler decisions (from their host copies)
  // Row 0 of the router's choices, [L, C, K] each, and of the reference's scores [L, C, E]
  // (undefined when not tapped): flips and margins are computed once per canvas.
  at::Tensor ids_ref, ids_run, scores;
};

struct Acc {
  ComparisonResult r;
  Engine* ref = nullptr;
  Engine* run = nullptr;
  std::vector<float> frac, abs, ulp, pos, pos_abs, pos_ulp, margin;
  std::vector<std::uint8_t> flips, sampler;
  std::vector<PendingTick> pending;
};

struct Layout {
  std::vector<Tap> taps;  // the T axis
  int layers = 0;
  std::int64_t c = 0;
  std::int64_t k = 0;  // top-k experts
};

// Row 0 of the tap of each layer, stacked (a copy of row 0 only): [n, C, ...].
at::Tensor stack_row0(const StepTaps& taps, Tap tap, const std::vector<int>& layers) {
  std::vector<at::Tensor> rows;
  rows.reserve(layers.size());
  for (const int l : layers) {
    rows.push_back(taps.get(tap, l).select(0, 0));
  }
  return at::stack(rows);
}

// The (slot, tap index) cells whose tap both sinks recorded this tick, in tap then layer order,
// with the tensors to compare; `pick` maps a recorded tensor to the compared one.
template <class Pick>
void tapped_pairs(const StepTaps& ref, const StepTaps& run, const Layout& lay, Pick&& pick,
                  std::vector<probe::TapRow>& xs, std::vector<probe::TapRow>& ys,
                  std::vector<std::pair<std::int64_t, std::int64_t>>& where) {
  for (std::size_t t = 0; t < lay.taps.size(); ++t) {
    const Tap tap = lay.taps[t];
    const bool per_layer = probe::tap_is_per_layer(tap);
    for (int l = per_layer ? 0 : probe::kNoLayer; l < (per_layer ? lay.layers : 0); ++l) {
      const at::Tensor x = ref.get(tap, l);
      const at::Tensor y = run.get(tap, l);
      if (!x.defined() || !y.defined()) {
        continue;
      }
      pick(x, y, xs, ys);
      where.emplace_back(l == probe::kNoLayer ? lay.layers : l, static_cast<std::int64_t>(t));
    }
  }
}

// Appends one tick of NaN aggregates [L+1, T]; returns where the tick starts.
std::size_t grow_aggregates(Acc& a, const Layout& lay) {
  const std::size_t base = a.frac.size();
  a.frac.resize(base + static_cast<std::size_t>((lay.layers + 1) * lay.taps.size()), kNaN);
  a.abs.resize(a.frac.size(), kNaN);
  a.ulp.resize(a.frac.size(), kNaN);
  return base;
}

// Queues one tick of row-0 comparison (or an uncompared tick): the kernels run on the tensors'
// device; flush() reads the results back once per canvas.
void compare_row0(Acc& a, const Layout& lay, bool both) {
  const std::int64_t slots = lay.layers + 1;
  const auto ntap = static_cast<std::int64_t>(lay.taps.size());
  PendingTick p;
  p.base = grow_aggregates(a, lay);
  p.pbase = a.pos.size();
  a.pos.resize(p.pbase + static_cast<std::size_t>(slots * ntap * lay.c), kNaN);
  a.pos_abs.resize(a.pos.size(), kNaN);
  a.pos_ulp.resize(a.pos.size(), kNaN);
  p.lbase = a.flips.size();
  a.flips.resize(p.lbase + static_cast<std::size_t>(lay.layers * lay.c), 0);
  a.margin.resize(a.flips.size(), kNaN);
  p.sbase = a.sampler.size();
  a.sampler.resize(p.sbase + static_cast<std::size_t>(lay.c), 0);
  a.r.compared.push_back(both ? 1 : 0);
  if (!both) {
    return;
  }
  // Every tapped tensor of this tick, all layers and taps, in one launch.
  std::vector<probe::TapRow> xs;
  std::vector<probe::TapRow> ys;
  tapped_pairs(
      a.ref->taps, a.run->taps, lay,
      [](const at::Tensor& x, const at::Tensor& y, auto& xv, auto& yv) {
        xv.push_back({x, 0});
        yv.push_back({y, 0});
      },
      xs, ys, p.where);
  if (!xs.empty()) {
    p.diff = probe::position_diffs(xs, ys);  // [n, 3, C]
  }
  if (a.ref->taps.get(Tap::RouterTopkIds, 0).defined()) {
    std::vector<int> all_layers(static_cast<std::size_t>(lay.layers));
    std::iota(all_layers.begin(), all_layers.end(), 0);
    bool scores = true;
    for (const int l : all_layers) {
      scores = scores && a.ref->taps.get(Tap::RouterScores, l).defined();
    }
    p.ids_ref = stack_row0(a.ref->taps, Tap::RouterTopkIds, all_layers);
    p.ids_run = stack_row0(a.run->taps, Tap::RouterTopkIds, all_layers);
    if (scores) {
      p.scores = stack_row0(a.ref->taps, Tap::RouterScores, all_layers);
    }
  }
  p.sampler = true;
  a.pending.push_back(std::move(p));
}

// Queues rows 1.. of a batched run vs its own row 0 (aggregates only).
void compare_rows(Acc& a, const Layout& lay, bool stepped) {
  PendingTick p;
  p.base = grow_aggregates(a, lay);
  a.r.compared.push_back(stepped ? 1 : 0);
  if (!stepped) {
    return;
  }
  std::vector<probe::TapRow> xs;
  std::vector<probe::TapRow> ys;
  std::int64_t others = 0;
  tapped_pairs(
      a.run->taps, a.run->taps, lay,
      [&others](const at::Tensor& x, const at::Tensor& /*y*/, auto& xv, auto& yv) {
        // Rows 1.. against row 0, as extra pairs: [B - 1] pairs per cell (every tap of a run
        // has its batch size B as the first dimension).
        const std::int64_t b = x.size(0);
        TORCH_CHECK(others == 0 || others == b - 1, "compare_rows: taps of one run with ",
                    others + 1, " and ", b, " rows");
        others = b - 1;
        for (std::int64_t r = 1; r < b; ++r) {
          xv.push_back({x, 0});
          yv.push_back({x, r});
        }
      },
      xs, ys, p.where);
  if (xs.empty() || others < 1) {
    return;
  }
  const auto n = static_cast<std::int64_t>(p.where.size());
  // [n, 3, (B-1) * C]: each cell's rows and positions in order, reduced as contiguous rows.
  const at::Tensor d = probe::position_diffs(xs, ys)
                           .view({n, others, 3, lay.c})
                           .permute({0, 2, 1, 3})
                           .reshape({n, 3, -1});
  p.diff = at::stack({d.select(1, 0).mean(1), d.select(1, 1).amax(1), d.select(1, 2).amax(1)},
                     1);  // [n, 3]
  a.pending.push_back(std::move(p));
}

// Routing of the queued ticks, for all of them at once: flips [ticks with ids, L, C] and the
// reference's margins [ticks with scores, L, C], fp32 on the host.
std::pair<at::Tensor, at::Tensor> routing_of(const std::vector<PendingTick>& ticks,
                                             const Layout& lay) {
  std::vector<at::Tensor> ref;
  std::vector<at::Tensor> run;
  std::vector<at::Tensor> scores;
  for (const PendingTick& p : ticks) {
    if (p.ids_ref.defined()) {
      ref.push_back(p.ids_ref);
      run.push_back(p.ids_run);
    }
    if (p.scores.defined()) {
      scores.push_back(p.scores);
    }
  }
  at::Tensor flips;
  at::Tensor margins;
  if (!ref.empty()) {
    flips = probe::routing_flips(at::cat(ref), at::cat(run)).to(at::kFloat).cpu().contiguous();
  }
  if (!scores.empty()) {
    const at::Tensor all = at::cat(scores);  // [ticks * L, C, E]
    margins =
        probe::router_margin(all.reshape({all.size(0) * lay.c, -1}), lay.k).cpu().contiguous();
  }
  return {flips, margins};
}

// Reads the queued ticks' results back (one transfer per kind) into the host arrays; the
// sampler decisions come from the engines' host copies (flushed first).
void flush(Acc& a, const Layout& lay) {
  if (a.pending.empty()) {
    return;
  }
  std::vector<at::Tensor> parts;
  for (const PendingTick& p : a.pending) {
    if (p.diff.defined()) {
      parts.push_back(p.diff.reshape({-1}));
    }
  }
  const at::Tensor diff = parts.empty() ? at::Tensor() : at::cat(parts).cpu().contiguous();
  const auto [flips, margins] = routing_of(a.pending, lay);
  const auto ntap = static_cast<std::int64_t>(lay.taps.size());
  const auto c = static_cast<std::size_t>(lay.c);
  const std::size_t lc = static_cast<std::size_t>(lay.layers) * c;
  std::size_t di = 0;
  std::size_t fi = 0;
  std::size_t mi = 0;
  for (const PendingTick& p : a.pending) {
    if (p.diff.defined()) {
      const float* d = diff.data_ptr<float>() + di;
      const bool rows = p.diff.dim() == 2;  // [n, 3] aggregates, else [n, 3, C]
      for (std::size_t i = 0; i < p.where.size(); ++i) {
        const auto [slot, t] = p.where[i];
        const std::size_t cell = p.base + static_cast<std::size_t>(slot * ntap + t);
        if (rows) {
          a.frac[cell] = d[3 * i];
          a.abs[cell] = d[3 * i + 1];
          a.ulp[cell] = d[3 * i + 2];
          continue;
        }
        const float* f = d + 3 * c * i;
        const std::size_t at = p.pbase + static_cast<std::size_t>(slot * ntap + t) * c;
        std::copy(f, f + c, a.pos.begin() + static_cast<std::ptrdiff_t>(at));
        std::copy(f + c, f + 2 * c, a.pos_abs.begin() + static_cast<std::ptrdiff_t>(at));
        std::copy(f + 2 * c, f + 3 * c, a.pos_ulp.begin() + static_cast<std::ptrdiff_t>(at));
        a.frac[cell] = std::accumulate(f, f + c, 0.0F) / static_cast<float>(lay.c);
        a.abs[cell] = std::accumulate(f + c, f + 2 * c, 0.0F,
                                      [](float m, float v) { return std::max(m, v); });
        a.ulp[cell] = std::accumulate(f + 2 * c, f + 3 * c, 0.0F,
                                      [](float m, float v) { return std::max(m, v); });
      }
      di += static_cast<std::size_t>(p.diff.numel());
    }
    if (p.sampler) {
      // The tick's row-0 decisions of both engines sit at the same place in their arrays.
      const Engine& x = *a.ref;
      const Engine& y = *a.run;
      for (std::size_t e = p.sbase; e < p.sbase + c; ++e) {
        a.sampler[e] =
            static_cast<std::uint8_t>((x.canvas_in[e] != y.canvas_in[e] ? CanvasInDiffers : 0) |
                                      (x.sampled[e] != y.sampled[e] ? SampledDiffers : 0) |
                                      (x.argmax[e] != y.argmax[e] ? ArgmaxDiffers : 0) |
                                      (x.accepted[e] != y.accepted[e] ? AcceptedDiffers : 0));
      }
    }
    if (p.ids_ref.defined()) {
      const float* f = flips.data_ptr<float>() + fi;
      for (std::size_t i = 0; i < lc; ++i) {
        a.flips[p.lbase + i] = f[i] > 0 ? 1 : 0;
      }
      fi += lc;
    }
    if (p.scores.defined()) {
      std::copy(margins.data_ptr<float>() + mi, margins.data_ptr<float>() + mi + lc,
                a.margin.begin() + static_cast<std::ptrdiff_t>(p.lbase));
      mi += lc;
    }
  }
  a.pending.clear();
}

// Reads an engine's queued row-0 tick data back in one transfer.
void flush(Engine& e, const Layout& lay) {
  if (e.pending.empty()) {
    return;
  }
  std::vector<at::Tensor> parts;
  parts.reserve(e.pending.size());
  for (const auto& [at, t] : e.pending) {
    parts.push_back(t);
  }
  const at::Tensor all = at::stack(parts).cpu().contiguous();  // [ticks, 5, C] fp64
  const double* v = all.data_ptr<double>();
  const auto c = static_cast<std::size_t>(lay.c);
  for (const auto& [at, t] : e.pending) {
    for (std::size_t p = 0; p < c; ++p) {
      e.canvas_in[at + p] = static_cast<std::int64_t>(v[p]);
      e.argmax[at + p] = static_cast<std::int64_t>(v[c + p]);
      e.sampled[at + p] = static_cast<std::int64_t>(v[2 * c + p]);
      e.accepted[at + p] = v[3 * c + p] != 0 ? 1 : 0;
      e.entropy[at + p] = static_cast<float>(v[4 * c + p]);
    }
    v += 5 * c;
  }
  e.pending.clear();
}

// The first (tick, slot, tap, position) that differs, scanning each tick in model order:
// self-conditioning taps, then the layers in order, then the logits.
Divergence first_divergence(const ComparisonResult& c, const Layout& lay,
                            const std::vector<std::string>& names, const RunResult& ref) {
  Divergence d;
  const std::int64_t s_count = c.frac_differ.empty() ? 0 : c.frac_differ.shape[0];
  const auto ntap = static_cast<std::int64_t>(lay.taps.size());
  std::vector<std::pair<std::int64_t, std::int64_t>> order;  // (slot, tap)
  for (std::int64_t t = 0; t < ntap; ++t) {
    const Tap tap = lay.taps[static_cast<std::size_t>(t)];
    if (!probe::tap_is_per_layer(tap) && tap != Tap::Logits) {
      order.emplace_back(lay.layers, t);
    }
  }
  for (std::int64_t l = 0; l < lay.layers; ++l) {
    for (std::int64_t t = 0; t < ntap; ++t) {
      if (probe::tap_is_per_layer(lay.taps[static_cast<std::size_t>(t)])) {
        order.emplace_back(l, t);
      }
    }
  }
  for (std::int64_t t = 0; t < ntap; ++t) {
    if (lay.taps[static_cast<std::size_t>(t)] == Tap::Logits) {
      order.emplace_back(lay.layers, t);
    }
  }
  for (std::int64_t s = 0; s < s_count; ++s) {
    if (c.compared[static_cast<std::size_t>(s)] == 0) {
      continue;
    }
    for (const auto& [slot, t] : order) {
      const float f = c.frac_differ.at({s, slot, t});
      if (!(f > 0)) {
        continue;
      }
      d.tick = static_cast<int>(s);
      d.layer = slot < lay.layers ? static_cast<int>(slot) : -1;
      d.tap = names[static_cast<std::size_t>(t)];
      if (!c.pos_frac_differ.empty()) {
        for (std::int64_t p = 0; p < lay.c; ++p) {
          if (c.pos_frac_differ.at({s, slot, t, p}) > 0) {
            d.position = p;
            break;
          }
        }
      }
      break;
    }
    if (!d.found() && !c.sampler_diff.empty()) {
      for (std::int64_t p = 0; p < lay.c; ++p) {
        if (c.sampler_diff.at({s, p}) != 0) {
          d.tick = static_cast<int>(s);
          d.tap = "sampler";
          d.position = p;
          break;
        }
      }
    }
    if (d.found()) {
      d.canvas = ref.tick_canvas[static_cast<std::size_t>(s)];
      d.step = ref.tick_step[static_cast<std::size_t>(s)];
      return d;
    }
  }
  return d;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Provenance provenance(const ExperimentSpec& spec, bool emulated) {
  Provenance p;
  const auto& build = base::build_info();
  p.tool_version = build.tool_version + " (" + build.git_hash + ")";
  p.created_utc = utc_now();
  p.device = spec.load.device;
  p.dtype = spec.load.dtype;
  p.emulated = emulated;
  if (auto info = base::query_system_info(); info.ok()) {
    const base::SystemInfo& i = info.value();
    p.host = i.host;
    p.libtorch = i.libtorch_version;
    p.threads = i.torch_threads;
    p.blas = i.blas + (i.mkldnn ? " + oneDNN" : "");
    p.device_name = i.cpu_model;
    if (spec.load.device.rfind("cuda", 0) == 0 && !i.gpus.empty()) {
      const auto colon = spec.load.device.find(':');
      const std::size_t index =
          colon == std::string::npos ? 0 : std::stoul(spec.load.device.substr(colon + 1));
      p.device_name = index < i.gpus.size() ? i.gpus[index].name : i.gpus.front().name;
      p.driver = i.gpu_driver;
      p.cuda = std::to_string(i.cuda_runtime_version / 1000) + "." +
               std::to_string((i.cuda_runtime_version % 1000) / 10);
      p.cublas = i.cublas_version;
    }
  }
  return p;
}

template <class T>
NdArray<T> shaped(std::vector<T> data, const std::vector<std::int64_t>& shape) {
  NdArray<T> a;
  a.shape = shape;
  a.data = std::move(data);
  return a;
}

}  // namespace

base::Result<ExperimentResult> run_experiment(const ExperimentSpec& spec,
                                              const RunControl& control) {
  return base::guarded([&]() -> ExperimentResult {
    if (auto v = validate(spec); !v.ok()) {
      throw base::ErrorException(v.error());
    }
    ExperimentResult out;
    out.spec = spec;
    model::LoadOptions load = spec.load;
    load.progress = control.load_progress;
    load.cancel = control.cancel;
    // What will run, for the memory check before loading: a group's engines coexist (its B=1
    // reference and repeats and every batch), the groups one after the other.
    load.workload.rows = 1 + spec.repeats;
    load.workload.max_batch = 1;
    for (const std::int64_t b : spec.batch_sizes) {
      load.workload.rows += b;
      load.workload.max_batch = std::max(load.workload.max_batch, b);
    }
    const setup::Session session = take(setup::open_session(
        spec.model, load, {spec.prompt, spec.chat_template, spec.prompt_ids}, spec.overrides));
    const setup::Inputs& in = session.inputs;
    const sampling::GenerationConfig& gc = in.generation;
    out.generation_config_json = sampling::to_json(gc);
    out.prompt_ids = in.prompt_ids;
    out.prompt_text = in.prompt_text;
    out.timings.load_s = session.load_s;
    const model::DiffusionGemma& m = *session.model;
    out.config_json = session.config_json;

    Layout lay;
    lay.layers = static_cast<int>(m.config().text.num_hidden_layers);
    lay.c = m.config().canvas_length;
    lay.k = m.config().text.top_k_experts;
    std::bitset<probe::kTapCount> wanted;
    if (spec.taps.empty()) {
      for (Tap t : probe::all_taps()) {
        lay.taps.push_back(t);
      }
    } else if (!(spec.taps.size() == 1 && spec.taps[0] == "none")) {
      for (const auto& n : spec.taps) {
        lay.taps.push_back(*probe::tap_from_name(n));
      }
    }
    for (Tap t : lay.taps) {
      wanted.set(static_cast<std::size_t>(t));
      out.taps.emplace_back(probe::tap_name(t));
    }
    out.layers = lay.layers;
    out.canvas_length = lay.c;
    out.top_k = lay.k;

    // Runs, by group.
    struct Planned {
      std::string id;
      std::int64_t batch;
      std::string group;
      std::string policy;
    };
    std::vector<Planned> plan;
    const auto add_group = [&](const std::string& group, const std::string& prefix,
                               const std::string& policy, int repeats) {
      plan.push_back({prefix + "ref", 1, group, policy});
      for (int r = 1; r <= repeats; ++r) {
        plan.push_back({prefix + "repeat" + std::to_string(r), 1, group, policy});
      }
      for (std::int64_t b : spec.batch_sizes) {
        plan.push_back({prefix + "b" + std::to_string(b), b, group, policy});
      }
    };
    add_group("main", "", spec.policy, spec.repeats);
    if (!spec.workaround.empty()) {
      add_group("workaround", "wa.", spec.policy + "+" + spec.workaround, 0);
    }
    const at::Tensor prompt =
        at::tensor(out.prompt_ids, at::TensorOptions().dtype(at::kLong)).view({1, -1});
    const std::int64_t canvases = (gc.max_new_tokens + lay.c - 1) / lay.c;
    const std::int64_t groups = spec.workaround.empty() ? 1 : 2;
    base::ProgressClock clock(groups * canvases * gc.sampler.max_denoising_steps);
    std::int64_t ticks_done = 0;
    const bool lockstep = spec.mode == RunMode::Lockstep;

    for (const std::string group : {"main", "workaround"}) {
      std::vector<std::unique_ptr<Engine>> engines;
      for (const Planned& p : plan) {
        if (p.group != group) {
          continue;
        }
        auto e = std::make_unique<Engine>(wanted);
        e->taps.set_first_row_only(!(lockstep && p.batch > 1));
        e->result.id = p.id;
        e->result.batch_size = p.batch;
        e->result.group = group;
        e->policy = std::make_unique<ops::OpPolicy>(take(ops::policy_by_name(p.policy)));
        e->result.policy_json = ops::to_json(*e->policy).dump();
        e->result.policy_text = ops::describe(*e->policy);
        e->result.emulated = e->policy->emulate_split_k.any();
        out.provenance.emulated = out.provenance.emulated || e->result.emulated;
        sampling::GenerateOptions o;
        o.batch_size = p.batch;
        o.seed = spec.seed;
        o.rng = spec.rng;
        o.prefill = spec.prefill;
        o.config = gc;
        o.policy = e->policy.get();
        o.cancel = control.cancel;
        const auto t0 = std::chrono::steady_clock::now();
        e->engine = std::make_unique<sampling::GenerationEngine>(m, prompt, o);
        e->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        engines.push_back(std::move(e));
      }
      if (engines.empty()) {
        continue;
      }
      Engine* leader = engines.front().get();
      std::vector<Acc> accs;
      for (std::size_t i = 1; i < engines.size(); ++i) {
        Acc a;
        a.ref = leader;
        a.run = engines[i].get();
        a.r.reference = leader->result.id;
        a.r.run = a.run->result.id;
        a.r.id = a.r.reference + "__" + a.r.run;
        accs.push_back(std::move(a));
        if (lockstep && engines[i]->result.batch_size > 1) {
          Acc rows;
          rows.ref = engines[i].get();
          rows.run = engines[i].get();
          rows.r.kind = "rows";
          rows.r.reference = rows.r.run = engines[i]->result.id;
          rows.r.id = engines[i]->result.id + ".rows";
          accs.push_back(std::move(rows));
        }
      }
      std::int64_t ticks = 0;
      const auto timed = [](Engine& e, auto&& f) {
        const auto t0 = std::chrono::steady_clock::now();
        f();
        e.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      };
      const auto all_done = [&] {
        for (const auto& e : engines) {
          if (!e->engine->done()) {
            return false;
          }
        }
        return true;
      };
      while (!all_done()) {
        for (auto& e : engines) {
          if (!e->engine->done()) {
            timed(*e, [&] { e->engine->begin_canvas(); });
          }
        }
        // Step the canvas: every engine that still denoises takes one step per tick.
        while (true) {
          bool any = false;
          for (auto& e : engines) {
            e->stepped = false;
            e->taps.clear();
            const bool leader_follow = lockstep && e.get() != leader;
            const bool can =
                !e->engine->done() && (leader_follow ? !leader->engine->done() && leader->stepped
                                                     : !e->engine->canvas_done());
            if (e.get() == leader) {
              const sampling::DenoiserState pre = leader->engine->snapshot();
              if (!leader->engine->done() && !leader->engine->canvas_done()) {
                timed(*e, [&] { e->last = leader->engine->step(&e->taps); });
                e->stepped = true;
                any = true;
              }
              // Followers in lockstep decode the leader's input of this step.
              for (auto& f : engines) {
                if (lockstep && f.get() != leader && e->stepped && !f->engine->done()) {
                  f->engine->adopt(pre);
                }
              }
              continue;
            }
            if (!can) {
              continue;
            }
            timed(*e, [&] { e->last = e->engine->step(&e->taps); });
            e->stepped = true;
            any = true;
            if (leader_follow) {
              e->engine->adopt(leader->engine->snapshot());
            }
          }
          if (!any) {
            break;
          }
          if (control.cancel != nullptr && control.cancel->cancelled()) {
            base::raise(ErrorCode::Cancelled, "experiment cancelled");
          }
          const auto compare_start = std::chrono::steady_clock::now();
          for (auto& e : engines) {
            RunResult& r = e->result;
            const auto c = static_cast<std::size_t>(lay.c);
            r.tick_canvas.push_back(e->stepped ? e->engine->canvas() : -1);
            r.tick_step.push_back(e->stepped ? e->engine->step_index() : -1);
            if (!e->stepped) {
              e->canvas_in.insert(e->canvas_in.end(), c, -1);
              e->argmax.insert(e->argmax.end(), c, -1);
              e->sampled.insert(e->sampled.end(), c, -1);
              e->accepted.insert(e->accepted.end(), c, 0);
              e->entropy.insert(e->entropy.end(), c, kNaN);
              continue;
            }
            const sampling::StepTensors& l = e->last;
            e->pending.emplace_back(
                e->canvas_in.size(),
                at::stack({l.canvas_in.to(at::kDouble), l.argmax.to(at::kDouble),
                           l.sampled.to(at::kDouble), l.accepted.to(at::kDouble),
                           l.entropy.to(at::kDouble)})
                    .select(1, 0));
            e->canvas_in.resize(e->canvas_in.size() + c);
            e->argmax.resize(e->argmax.size() + c);
            e->sampled.resize(e->sampled.size() + c);
            e->accepted.resize(e->accepted.size() + c);
            e->entropy.resize(e->entropy.size() + c);
          }
          for (Acc& a : accs) {
            if (a.r.kind == "rows") {
              compare_rows(a, lay, a.run->stepped);
            } else {
              compare_row0(a, lay, a.ref->stepped && a.run->stepped);
            }
          }
          out.timings.comparisons_s += since(compare_start);
          ++ticks;
          ++ticks_done;
          if (control.progress) {
            control.progress(clock.at(std::min(ticks_done, clock.total()),
                                      std::string(group == "main" ? "" : "workaround: ") +
                                          "canvas " + std::to_string(leader->engine->canvas() + 1) +
                                          " step " + std::to_string(leader->engine->step_index()) +
                                          "/" + std::to_string(gc.sampler.max_denoising_steps)));
          }
        }
        for (auto& e : engines) {
          if (!e->engine->done()) {
            if (lockstep && e.get() != leader) {
              e->engine->adopt(leader->engine->snapshot());
            }
            timed(*e, [&] { e->engine->end_canvas(); });
          }
        }
        // The canvas's per-tick results, read back in one transfer per engine and comparison.
        const auto flush_start = std::chrono::steady_clock::now();
        for (auto& e : engines) {
          flush(*e, lay);
        }
        for (Acc& a : accs) {
          flush(a, lay);
        }
        out.timings.comparisons_s += since(flush_start);
        out.timings.readback_s += since(flush_start);
      }
      // Results of the group.
      const auto results_start = std::chrono::steady_clock::now();
      for (const auto& e : engines) {
        out.timings.engines_s += e->seconds;
      }
      const auto s = ticks;
      for (auto& e : engines) {
        RunResult& r = e->result;
        r.canvas_in = shaped(std::move(e->canvas_in), {s, lay.c});
        r.argmax = shaped(std::move(e->argmax), {s, lay.c});
        r.sampled = shaped(std::move(e->sampled), {s, lay.c});
        r.accepted = shaped(std::move(e->accepted), {s, lay.c});
        r.entropy = shaped(std::move(e->entropy), {s, lay.c});
        const sampling::GenerationResult g = e->engine->result();
        r.tokens = g.rows[0].tokens;
        r.stop_position = g.rows[0].stop_position;
        r.steps = g.rows[0].steps;
        r.text = in.decode_until_stop(r.tokens, r.stop_position);
        r.wall_time_s = e->seconds;
      }
      const std::int64_t slots = lay.layers + 1;
      const auto ntap = static_cast<std::int64_t>(lay.taps.size());
      for (Acc& a : accs) {
        ComparisonResult& c = a.r;
        c.frac_differ = shaped(std::move(a.frac), {s, slots, ntap});
        c.max_abs = shaped(std::move(a.abs), {s, slots, ntap});
        c.max_ulp = shaped(std::move(a.ulp), {s, slots, ntap});
        if (c.kind == "row0") {
          c.pos_frac_differ = shaped(std::move(a.pos), {s, slots, ntap, lay.c});
          c.pos_max_abs = shaped(std::move(a.pos_abs), {s, slots, ntap, lay.c});
          c.pos_max_ulp = shaped(std::move(a.pos_ulp), {s, slots, ntap, lay.c});
          c.routing_flips = shaped(std::move(a.flips), {s, lay.layers, lay.c});
          c.router_margin = shaped(std::move(a.margin), {s, lay.layers, lay.c});
          c.sampler_diff = shaped(std::move(a.sampler), {s, lay.c});
          const RunResult& ref = a.ref->result;
          const RunResult& run = a.run->result;
          c.token_diff = text::token_diff(ref.tokens, run.tokens);
          c.tokens_changed = text::changed_count(c.token_diff);
          c.tokens_identical = c.tokens_changed == 0;
          c.stop_changed = ref.stop_position != run.stop_position;
          c.steps_changed = ref.steps != run.steps;
        }
        c.first = first_divergence(c, lay, out.taps, a.ref->result);
        out.comparisons.push_back(std::move(c));
      }
      for (auto& e : engines) {
        out.runs.push_back(std::move(e->result));
      }
      out.timings.results_s += since(results_start);
    }
    out.provenance = provenance(spec, out.provenance.emulated);
    return out;
  });
}

}  // namespace batchlens::experiment
