// SPDX-License-Identifier: Apache-2.0
#include "core/setup/forward_file.h"

#include <algorithm>
#include <chrono>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>

#include "core/compat/device_graph.h"
#include "core/compat/profile.h"
#include "core/model/diffusion_gemma.h"
#include "core/model/safetensors.h"
#include "core/probe/taps.h"
#include "core/setup/engine_pass.h"

namespace batchlens::setup {

using model::DiffusionGemma;
using model::ForwardContext;
using model::KvCache;
using model::SafetensorsFile;
using model::write_safetensors;

namespace {

at::Tensor require(const SafetensorsFile& file, const std::string& name) {
  if (file.tensors().count(name) == 0) {
    base::raise(base::ErrorCode::InvalidArgument,
                file.path().string() + ": missing tensor '" + name + "'");
  }
  return file.tensor(name);
}

std::bitset<probe::kTapCount> resolve_taps(const std::vector<std::string>& names) {
  std::bitset<probe::kTapCount> set;
  for (const auto& n : names) {
    if (n == "all") {
      set.set();
      continue;
    }
    const auto tap = probe::tap_from_name(n);
    if (!tap) {
      base::raise(base::ErrorCode::InvalidArgument, "unknown tap '" + n + "'");
    }
    set.set(static_cast<std::size_t>(*tap));
  }
  return set;
}

void sync(const at::Device& device) {
  if (device.is_cuda()) {
    // A tiny device-to-host copy waits for all queued work on the current stream.
    (void)at::zeros({1}, at::TensorOptions().device(device)).cpu();
  }
}

using Clock = std::chrono::steady_clock;

std::pair<double, double> median_min(std::vector<double> times) {
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], times.front()};
}

struct GraphTiming {
  double eager_median = 0.0, eager_min = 0.0, graph_median = 0.0, graph_min = 0.0;
  double capture_ms = 0.0;
  bool bitwise = false;  // the graph's logits are `expected`, bit for bit
};

// Eager decoder passes with the canvas already on the device and no host synchronisation
// inside the pass, then the same pass captured once as a CUDA graph and replayed; the graph's
// logits are compared with `expected` (or with the eager pass's when undefined).
GraphTiming time_graph(const DiffusionGemma& model, const at::Tensor& canvas_dev,
                       const KvCache& cache, const at::Tensor& sc, const ForwardContext& ctx,
                       int repeat, at::Tensor& expected) {
  const at::Device device = model.device();
  GraphTiming g;
  const at::Tensor eager = model.decode(canvas_dev, cache, sc, ctx);  // warm-up
  if (!expected.defined()) {
    expected = eager;
  }
  std::vector<double> times;
  for (int i = 0; i < repeat; ++i) {
    const auto a = Clock::now();
    (void)model.decode(canvas_dev, cache, sc, ctx);
    sync(device);
    times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - a).count());
  }
  std::tie(g.eager_median, g.eager_min) = median_min(times);

  compat::DeviceGraph graph;
  at::Tensor out;
  const auto c0 = Clock::now();
  graph.capture(device, [&] { out = model.decode(canvas_dev, cache, sc, ctx); });
  g.capture_ms = std::chrono::duration<double, std::milli>(Clock::now() - c0).count();
  out.fill_(0.0F);  // replays must write every element
  graph.replay();
  sync(device);
  g.bitwise = at::equal(out.view(at::kInt), expected.view(at::kInt));
  times.clear();
  for (int i = 0; i < repeat; ++i) {
    const auto a = Clock::now();
    graph.replay();
    sync(device);
    times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - a).count());
  }
  std::tie(g.graph_median, g.graph_min) = median_min(times);
  return g;
}

// The port op by op (no fused kernels), then with the fused kernels, each eager and as a graph.
void time_graphs(const DiffusionGemma& model, const at::Tensor& canvas, const KvCache& cache,
                 const at::Tensor& sc, const ops::OpPolicy& policy, int repeat,
                 ForwardSummary& summary) {
  const at::Device device = model.device();
  if (!compat::DeviceGraph::supported(device)) {
    base::raise(base::ErrorCode::InvalidArgument,
                "--cuda-graph needs a CUDA device and a LibTorch build with CUDA");
  }
  const at::Tensor canvas_dev = canvas.to(device);
  ForwardContext ctx{&policy, nullptr};
  ctx.check_id_range = false;
  ctx.fused_kernels = false;
  at::Tensor expected;
  const GraphTiming plain = time_graph(model, canvas_dev, cache, sc, ctx, repeat, expected);
  summary.nosync_median_ms = plain.eager_median;
  summary.nosync_min_ms = plain.eager_min;
  summary.graph_median_ms = plain.graph_median;
  summary.graph_min_ms = plain.graph_min;
  summary.graph_capture_ms = plain.capture_ms;
  summary.graph_bitwise = plain.bitwise;
  if (!model.fused_kernels().any()) {
    return;
  }
  ctx.fused_kernels = true;
  const GraphTiming fused = time_graph(model, canvas_dev, cache, sc, ctx, repeat, expected);
  summary.fused_ran = true;
  summary.fused_nosync_median_ms = fused.eager_median;
  summary.fused_graph_median_ms = fused.graph_median;
  summary.fused_graph_min_ms = fused.graph_min;
  summary.fused_bitwise = fused.bitwise;
}

// ForwardRequest::engine_timing on CUDA: the pass as the engine runs it (EnginePass).
void time_engine(const DiffusionGemma& model, const at::Tensor& canvas, const KvCache& cache,
                 const at::Tensor& sc, const ops::OpPolicy& policy, int repeat,
                 ForwardSummary& summary) {
  EnginePass pass(model, canvas, cache, sc, policy);
  std::vector<double> times;
  times.reserve(static_cast<std::size_t>(std::max(repeat, 0)));
  for (int i = 0; i < repeat; ++i) {
    times.push_back(pass.time_ms());
  }
  std::tie(summary.engine_median_ms, summary.engine_min_ms) = median_min(times);
  summary.engine_mode = pass.mode();
}

}  // namespace

base::Result<ForwardSummary> run_forward_file(const DiffusionGemma& model,
                                              const ForwardRequest& request) {
  return base::guarded([&] {
    at::Tensor ids;
    at::Tensor canvas;
    at::Tensor sc;
    if (!request.inputs.empty()) {
      const auto inputs = SafetensorsFile::open(request.inputs);
      ids = require(*inputs, "input_ids");
      canvas = require(*inputs, "decoder_input_ids");
      if (inputs->tensors().count("self_conditioning_logits") != 0) {
        sc = inputs->tensor("self_conditioning_logits").to(model.device());
      }
    } else {
      EngineInputs random = random_engine_inputs(model, 0, request.prompt_length,
                                                 request.input_seed, request.self_conditioning);
      ids = random.ids;
      canvas = random.canvas;
      sc = random.sc;
    }
    if (ids.dim() != 2 || canvas.dim() != 2 || ids.size(0) != canvas.size(0)) {
      base::raise(base::ErrorCode::InvalidArgument,
                  "input_ids must be [B, L] and decoder_input_ids [B, C] with the same B");
    }
    at::Tensor ids_in = ids;
    at::Tensor canvas_in = canvas;
    if (request.rows > 0) {
      // Bitwise-identical rows: row 0 repeated (the paired-experiment setup).
      ids_in = ids.narrow(0, 0, 1).expand({request.rows, -1}).contiguous();
      canvas_in = canvas.narrow(0, 0, 1).expand({request.rows, -1}).contiguous();
      if (sc.defined()) {
        sc = sc.narrow(0, 0, 1).expand({request.rows, -1, -1}).contiguous();
      }
    }
    const ops::OpPolicy& policy = request.policy;
    probe::TapRecorder taps(resolve_taps(request.taps));

    ForwardSummary summary;
    summary.batch = ids_in.size(0);
    summary.prompt_length = ids.size(1);
    summary.canvas_length = canvas.size(1);
    summary.self_conditioning = sc.defined();
    summary.fused_report = model.fused_kernels().report;

    KvCache cache;
    auto t0 = Clock::now();
    // The timings: on CUDA the port op by op (the fused kernels are timed by --cuda-graph); on a
    // CPU as the engine runs, with the CPU GEMM where it was checked (BATCHLENS_FUSED_OFF=gemm
    // times ATen's).
    ForwardContext straight{&policy, nullptr};
    straight.fused_kernels = model.device().is_cpu();
    model.encode(ids_in.clone(), cache, ForwardContext{&policy, nullptr});
    sync(model.device());
    auto t1 = Clock::now();
    const at::Tensor logits =
        model.decode(canvas_in.clone(), cache, sc, ForwardContext{&policy, &taps});
    sync(model.device());
    auto t2 = Clock::now();
    summary.encode_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    summary.decode_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
    const bool engine_cuda = request.engine_timing && model.device().is_cuda();
    if (request.repeat > 0 && engine_cuda) {
      time_engine(model, canvas_in, cache, sc, policy, request.repeat, summary);
    } else if (request.repeat > 0) {
      // Timed passes without taps: what a generation step costs.
      std::vector<double> times;
      for (int i = 0; i < request.repeat; ++i) {
        const auto a = Clock::now();
        (void)model.decode(canvas_in, cache, sc, straight);
        sync(model.device());
        times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - a).count());
      }
      std::sort(times.begin(), times.end());
      summary.decode_median_ms = times[times.size() / 2];
      summary.decode_min_ms = times.front();
      if (request.engine_timing) {
        summary.engine_median_ms = summary.decode_median_ms;
        summary.engine_min_ms = summary.decode_min_ms;
        summary.engine_mode = "CPU passes as the engine runs them";
      }
    }
    if (request.repeat > 0 && request.cuda_graph && !engine_cuda) {
      try {
        time_graphs(model, canvas_in, cache, sc, policy, request.repeat, summary);
      } catch (const std::exception& e) {
        // Report, and keep the eager results (and the output file) of this forward.
        summary.graph_error = e.what();
      }
    }

    if (!request.profile.empty()) {
      ForwardContext ctx{&policy, nullptr};
      ctx.check_id_range = false;
      const at::Tensor canvas_dev = canvas_in.to(model.device());
      (void)model.decode(canvas_dev, cache, sc, ctx);  // warm-up outside the trace
      sync(model.device());
      compat::profile_to_file(request.profile.string(), [&] {
        for (int i = 0; i < 3; ++i) {
          (void)model.decode(canvas_dev, cache, sc, ctx);
        }
        sync(model.device());
      });
    }

    std::vector<std::pair<std::string, at::Tensor>> out;
    out.emplace_back("logits", logits);
    for (const auto& [key, value] : taps.recorded()) {
      if (key.first == probe::Tap::Logits) {
        continue;  // the same tensor as `logits`
      }
      std::string name(probe::tap_name(key.first));
      if (key.second != probe::kNoLayer) {
        name += "." + std::to_string(key.second);
      }
      out.emplace_back(name, value);
    }
    if (request.output.empty()) {
      return summary;
    }
    write_safetensors(request.output, out,
                      {{"batchlens_policy", ops::describe(policy)},
                       {"batchlens_experts", experts_impl_name(model.settings().experts)}});
    summary.tensors_written = out.size();
    return summary;
  });
}

}  // namespace batchlens::setup
