// SPDX-License-Identifier: Apache-2.0
// One decoder pass as the engine runs it, prepared once and then timed again and again: on
// CUDA the fused kernels replayed as a CUDA graph (where the replay gives the eager pass's
// bits), else eager without host syncs; on a CPU as the engine runs it. The timing behind
// `forward --engine-timing` and every cost (setup/policy_cost.h), and the seeded random inputs
// they run on.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

#include "core/ops/policy.h"

namespace batchlens::model {
class DiffusionGemma;
struct KvCache;
}  // namespace batchlens::model

namespace batchlens::setup {

/// A prompt, a canvas and self-conditioning logits for timing.
struct EngineInputs {
  at::Tensor ids;     ///< [B, L] int64, CPU
  at::Tensor canvas;  ///< [B, C] int64, CPU
  at::Tensor sc;      ///< [B, C, V] bf16 on the model's device; undefined without
};

/// Seeded random inputs of `rows` bitwise-identical rows (the paired-experiment setup): a
/// prompt of `prompt_length` tokens, a canvas, and (`self_conditioning`) logits.
EngineInputs random_engine_inputs(const model::DiffusionGemma& model, std::int64_t rows,
                                  std::int64_t prompt_length, std::uint64_t seed,
                                  bool self_conditioning);

/// Gives the blocks the caching allocator holds unused back to `device` before engines capture
/// their CUDA graphs (compat::release_cached_device_memory; a no-op on a CPU).
void release_cached_device_memory(const at::Device& device);

class EnginePass {
 public:
  /// Prepares the pass of `canvas` over `cache` under `policy` (copied): one warm-up pass, and
  /// on CUDA the capture and its bitwise check against the eager pass. `cache` must outlive
  /// this object. Throws base::ErrorException like the model's decode.
  EnginePass(const model::DiffusionGemma& model, const at::Tensor& canvas,
             const model::KvCache& cache, const at::Tensor& sc, const ops::OpPolicy& policy);
  ~EnginePass();
  EnginePass(const EnginePass&) = delete;
  EnginePass& operator=(const EnginePass&) = delete;
  EnginePass(EnginePass&&) = delete;
  EnginePass& operator=(EnginePass&&) = delete;

  /// Runs the pass once and waits for it: its wall time in milliseconds.
  double time_ms();
  /// How it runs: "CUDA graph replays, fused kernels", "eager without host syncs (why)",
  /// "CPU passes as the engine runs them".
  const std::string& mode() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace batchlens::setup
