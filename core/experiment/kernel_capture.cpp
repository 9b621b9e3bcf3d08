// SPDX-License-Identifier: Apache-2.0
#include "core/experiment/kernel_capture.h"

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "core/base/cancel.h"
#include "core/base/system_info.h"
#include "core/experiment/plan.h"
#include "core/experiment/run_vocabulary.h"
#include "core/generation/engine.h"
#include "core/generation/sampler.h"
#include "core/model/diffusion_gemma.h"
#include "core/ops/op_observer.h"
#include "core/ops/op_profile.h"
#include "core/setup/front_door.h"

namespace batchlens::experiment {

namespace {

using Clock = std::chrono::steady_clock;
// Collects the op layer's calls of one pass, one entry per (family, layer) in first-call order.
class Collector final : public ops::OpObserver {
 public:
  // `library` names who computes ATen's own GEMM calls here ("cuBLAS", "oneDNN", ...).
  Collector(bool marks, std::string library) : marks_(marks), library_(std::move(library)) {}

  void on_op(const ops::OpCall& call) override {
    ops::OpCall c = call;
    if (c.path == "at::linear" || c.path == "at::matmul") {
      c.path += " → " + library_;  // the library behind ATen's own call
    }
    const std::string family(ops::family_name(c.family));
    const auto key = std::make_pair(family, c.layer);
    auto it = index_.find(key);
    if (it == index_.end()) {
      it = index_.emplace(key, ops_.size()).first;
      OpKernels o;
      o.family = family;
      o.layer = c.layer;
      o.op = c.op;
      o.strategy = std::string(ops::strategy_name(c.strategy));
      o.m = c.m;
      o.n = c.n;
      o.k = c.k;
      o.dtype = c.dtype;
      o.path = c.path;
      ops_.push_back(std::move(o));
      paths_.emplace_back();
      paths_.back().insert(c.path);
    } else if (paths_[it->second].insert(c.path).second) {
      ops_[it->second].path += " | " + c.path;
    }
    ops_[it->second].calls += c.calls;
  }
  bool marks() const override { return marks_; }

  std::vector<OpKernels>& ops() { return ops_; }
  OpKernels* find(const std::string& family, int layer) {
    const auto it = index_.find({family, layer});
    return it == index_.end() ? nullptr : &ops_[it->second];
  }

 private:
  bool marks_;
  std::string library_;
  std::vector<OpKernels> ops_;
  std::vector<std::set<std::string>> paths_;
  std::map<std::pair<std::string, int>, std::size_t> index_;
};

// "bl/<family>/<layer>" back to its parts.
bool parse_scope(const std::string& scope, std::string& family, int& layer) {
  if (scope.rfind("bl/", 0) != 0) {
    return false;
  }
  const std::size_t slash = scope.rfind('/');
  if (slash <= 3) {
    return false;
  }
  family = scope.substr(3, slash - 3);
  try {
    layer = std::stoi(scope.substr(slash + 1));
  } catch (...) {
    return false;
  }
  return true;
}

// Who computes "at::linear" / "at::matmul" on this device and dtype.
std::string library_of(const at::Device& device, at::ScalarType dtype) {
  if (device.is_cuda()) {
    return "cuBLAS";
  }
  if (dtype == at::kBFloat16 || dtype == at::kHalf) {
    return base::query_cpu_isa().bf16_matmul;  // "oneDNN" or "ATen"
  }
  return "BLAS (" + std::string(at::hasMKL() ? "MKL" : "LibTorch's") + ")";
}

// The passes of `run`: prefill once as the spec makes it (a mixed batch: `mixed`, padded, masked
// and positioned as its engine does), then one decoder pass over a seeded canvas for each of
// `scs` (without, with self-conditioning: a decoder pass leaves the cache as it was). On CUDA the
// passes run under the profiler; `warm` runs an unprofiled pass first (library handles and
// heuristics caches made outside the trace: once per recording is enough, and the engines ran
// these shapes before). `sc_one` is the self-conditioning input's row, drawn at the first use
// and kept for the recording's other engines.
std::vector<EngineKernels> capture_run(const model::DiffusionGemma& model,
                                       const ExperimentSpec& spec, const at::Tensor& prompt,
                                       const generation::PaddedPrompts* mixed,
                                       const PlannedRun& run, const std::vector<bool>& scs,
                                       bool warm, at::Tensor& sc_one,
                                       const base::CancelToken* cancel) {
  auto start = Clock::now();
  const at::Device device = model.device();
  const std::int64_t b = run.batch_size;
  const std::int64_t c = model.config().canvas_length;
  const std::int64_t vocab = model.config().text.vocab_size;
  const model::ForwardContext plain{&run.policy, nullptr};
  model::KvCache cache;
  at::Tensor positions;  // [B, C] int64 for per-row positions, else the model's default
  if (mixed != nullptr) {
    const generation::PositionMode mode = spec.composition.positions;
    model.encode(mixed->ids.to(device), cache, plain,
                 generation::prefill_layout(*mixed, mode, device));
    positions = generation::canvas_positions(*mixed, mode, 0, c, device);
  } else if (spec.prefill == generation::PrefillMode::Copied) {
    model::KvCache one;
    model.encode(prompt, one, plain);
    cache = one.repeat_rows(b);
  } else {
    model.encode(prompt.expand({b, -1}).contiguous(), cache, plain);
  }
  const bool profiled = device.is_cuda() && ops::kernel_profiler_available();
  std::vector<EngineKernels> out;
  for (const bool sc : scs) {
    if (cancel != nullptr && cancel->cancelled()) {
      base::raise(base::ErrorCode::Cancelled, "kernel provenance cancelled");
    }
    auto gen = at::make_generator<at::CPUGeneratorImpl>(spec.seed + 0x9e3779b97f4a7c15ULL);
    const at::Tensor canvas = at::randint(vocab, {1, c}, gen, at::TensorOptions().dtype(at::kLong))
                                  .to(device)
                                  .expand({b, -1})
                                  .contiguous();  // [B, C] int64
    at::Tensor sc_logits;
    if (sc) {
      if (!sc_one.defined()) {
        // Drawn on the device, once per recording: [1, C, V] is 67 M values for a 262,144-token
        // vocabulary, a third of a second on a host's generator for each engine.
        sc_one = generation::RandomStreams(generation::RngMode::Shared, spec.seed, 1, device)
                     .normal({1, c, vocab})
                     .to(model.weights().embed.scalar_type());  // [1, C, V]
      }
      // [B, C, V] in the embedding's dtype, as the engine passes
      sc_logits = sc_one.expand({b, -1, -1}).contiguous();
    }
    Collector collector(device.is_cuda(), library_of(device, model.dtype()));
    const model::ForwardContext observed{&run.policy, nullptr, /*check_id_range=*/false,
                                         /*fused_kernels=*/true, &collector};
    EngineKernels e;
    e.run = run.id;
    e.batch_size = static_cast<int>(b);
    e.policy = ops::policy_text(run.policy);
    e.self_conditioning = sc;
    e.device = device.str();
    if (profiled) {
      if (warm) {
        (void)model.decode(canvas, cache, sc_logits,
                           model::ForwardContext{&run.policy, nullptr, false}, positions);
        warm = false;
      }
      const std::vector<ops::KernelSeen> launched = ops::profile_marked_kernels(
          [&] { (void)model.decode(canvas, cache, sc_logits, observed, positions); });
      for (const ops::KernelSeen& k : launched) {
        std::string family;
        int layer = -1;
        if (!parse_scope(k.scope, family, layer)) {
          continue;  // elementwise work outside the op layer
        }
        OpKernels* op = collector.find(family, layer);
        if (op == nullptr) {
          continue;
        }
        auto same =
            std::find_if(op->kernels.begin(), op->kernels.end(), [&](const KernelLaunch& x) {
              return x.name == k.name && x.grid == k.grid && x.block == k.block;
            });
        if (same == op->kernels.end()) {
          op->kernels.push_back(KernelLaunch{k.name, k.grid, k.block, 0, 0.0});
          same = op->kernels.end() - 1;
        }
        ++same->calls;
        same->total_us += k.duration_us;
      }
    } else {
      (void)model.decode(canvas, cache, sc_logits, observed, positions);
    }
    e.ops = std::move(collector.ops());
    // The first pass's time includes the prefill.
    const auto now = Clock::now();
    e.seconds = std::chrono::duration<double>(now - start).count();
    start = now;
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

KernelProvenance capture_kernels(const setup::Session& session, const ExperimentSpec& spec,
                                 const std::vector<std::int64_t>& prompt_ids,
                                 const std::vector<std::vector<std::int64_t>>& companion_ids,
                                 const std::vector<PlannedGroup>& groups,
                                 const base::CancelToken* cancel) {
  const auto start = Clock::now();
  const model::DiffusionGemma& model = *session.model;
  KernelProvenance k;
  k.source = model.device().is_cuda() && ops::kernel_profiler_available()
                 ? "profiler (Kineto): one uncaptured decoder pass per engine"
                 : "op layer paths: one decoder pass per engine";
  const at::Tensor prompt = at::tensor(prompt_ids, at::TensorOptions().dtype(at::kLong))
                                .view({1, -1})
                                .to(model.device());  // [1, L] int64
  bool warm = true;
  at::Tensor sc_one;  // [1, C, V], drawn once
  for (const PlannedGroup& g : groups) {
    for (const PlannedRun& run : g.runs) {
      if (role_of_run(run.id) == RunRole::Repeat) {
        continue;  // the reference's engine again
      }
      std::optional<generation::PaddedPrompts> mixed;
      if (!companion_ids.empty() && run.batch_size > 1) {
        mixed = generation::pad_left(
            generation::batch_rows(prompt_ids, companion_ids, run.batch_size, spec.composition.row),
            session.model->config().text.pad_token_id);
      }
      for (EngineKernels& e : capture_run(model, spec, prompt, mixed ? &*mixed : nullptr, run,
                                          {false, true}, warm, sc_one, cancel)) {
        k.engines.push_back(std::move(e));
      }
      warm = false;
    }
  }
  k.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  return k;
}

}  // namespace batchlens::experiment
