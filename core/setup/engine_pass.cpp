// SPDX-License-Identifier: Apache-2.0
#include "core/setup/engine_pass.h"

#include <chrono>
#include <exception>
#include <optional>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#ifdef BL_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "core/compat/device_graph.h"
#include "core/model/diffusion_gemma.h"

namespace batchlens::setup {

using model::DiffusionGemma;
using model::ForwardContext;
using model::KvCache;

namespace {

using Clock = std::chrono::steady_clock;

void wait_for(const at::Device& device) {
  if (device.is_cuda()) {
    // A tiny device-to-host copy waits for all queued work on the current stream.
    (void)at::zeros({1}, at::TensorOptions().device(device)).cpu();
  }
}

}  // namespace

EngineInputs random_engine_inputs(const DiffusionGemma& model, std::int64_t rows,
                                  std::int64_t prompt_length, std::uint64_t seed,
                                  bool self_conditioning) {
  const auto& text = model.config().text;
  const std::int64_t canvas_length = model.config().canvas_length;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  EngineInputs in;
  in.ids = at::randint(3, text.vocab_size, {1, prompt_length}, gen, i64);  // [1, L]
  in.canvas = at::randint(text.vocab_size, {1, canvas_length}, gen, i64);  // [1, C]
  if (self_conditioning) {
    in.sc = (at::randn({1, canvas_length, text.vocab_size}, gen) * 2.0)  // [1, C, V] bf16
                .to(at::kBFloat16)
                .to(model.device());
  }
  if (rows > 0) {
    in.ids = in.ids.expand({rows, -1}).contiguous();
    in.canvas = in.canvas.expand({rows, -1}).contiguous();
    if (in.sc.defined()) {
      in.sc = in.sc.expand({rows, -1, -1}).contiguous();
    }
  }
  return in;
}

void release_cached_device_memory(const at::Device& device) {
  compat::release_cached_device_memory(device);
}

struct EnginePass::Impl {
  Impl(const DiffusionGemma& m, const KvCache& c, at::Tensor s, ops::OpPolicy p)
      : model(m), cache(c), sc(std::move(s)), policy(std::move(p)) {}

  at::Tensor decode() const { return model.decode(canvas, cache, sc, ctx); }

  const DiffusionGemma& model;
  const KvCache& cache;
  at::Tensor canvas;  // [B, C] on the model's device
  at::Tensor sc;
  ops::OpPolicy policy;
  ForwardContext ctx;
  std::optional<compat::DeviceGraph> graph;
  at::Tensor out;  // the graph's logits
  std::string mode;
};

EnginePass::EnginePass(const DiffusionGemma& model, const at::Tensor& canvas, const KvCache& cache,
                       const at::Tensor& sc, const ops::OpPolicy& policy)
    : impl_(std::make_unique<Impl>(model, cache, sc, policy)) {
  Impl& p = *impl_;
  const at::Device device = model.device();
  p.canvas = canvas.to(device);
  p.ctx = ForwardContext{&p.policy, nullptr};
  p.ctx.fused_kernels = true;
  if (device.is_cpu()) {
    p.mode = "CPU passes as the engine runs them";
    (void)p.decode();  // warm-up
    return;
  }
  // On a device the ids are the engine's own: no range check (a host sync, and impossible in
  // a capture).
  p.ctx.check_id_range = false;
  const std::string fused = model.fused_kernels().any() ? ", fused kernels" : "";
  std::string fallback;
#ifdef BL_WITH_CUDA
  // Blocks cached by earlier passes (or the batch-invariance check) go back to the device: the
  // graph allocates from a pool of its own and cannot use them.
  c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  const at::Tensor eager = p.decode();  // warm-up, and the bits the graph must give
  if (compat::DeviceGraph::supported(device)) {
    try {
      p.graph.emplace();
      p.graph->capture(device, [&p] { p.out = p.decode(); });
      p.out.fill_(0.0F);  // the replay must write every element
      p.graph->replay();
      wait_for(device);
      if (at::equal(p.out.view(at::kInt), eager.view(at::kInt))) {
        p.mode = "CUDA graph replays" + fused;
        return;
      }
      fallback = "the graph replay differed from eager";
    } catch (const std::exception& e) {
      const std::string what = e.what();
      fallback = "CUDA graph capture failed: " + what.substr(0, what.find('\n')).substr(0, 120);
    }
    p.graph.reset();
  } else {
    fallback = "no CUDA graphs in this build";
  }
  p.mode = "eager without host syncs" + fused + " (" + fallback + ")";
}

EnginePass::~EnginePass() = default;

double EnginePass::time_ms() {
  Impl& p = *impl_;
  const auto start = Clock::now();
  if (p.graph) {
    p.graph->replay();
  } else {
    (void)p.decode();
  }
  wait_for(p.model.device());
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

const std::string& EnginePass::mode() const {
  return impl_->mode;
}

}  // namespace batchlens::setup
