// SPDX-License-Identifier: Apache-2.0
// Block-diffusion generation: DiffusionGemmaGenerationMixin.generate ported to LibTorch, with
// per-row random streams (or the reference's shared stream) and a per-step record.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/base/cancel.h"
#include "core/model/diffusion_gemma.h"
#include "core/ops/policy.h"
#include "core/sampling/sampler.h"

namespace batchlens::sampling {

/// How the prompt cache is built for a batch of identical rows.
enum class PrefillMode {
  Copied,   ///< prefill at batch 1, copy the cache into every row (the user's setup)
  Batched,  ///< prefill all rows together (prefill kernels then see the batch shape too)
};

/// One denoising step of one canvas, for every row (tensors on the CPU).
struct StepRecord {
  int canvas = 0;         ///< canvas index, 0-based
  int step = 0;           ///< steps done in this canvas, 1-based
  int cur_step = 0;       ///< the reference's countdown N .. 1
  float temperature = 0;  ///< the step's temperature (fp32)
  at::Tensor canvas_in;   ///< [B, C] int64 the decoder's input canvas
  at::Tensor sampled;     ///< [B, C] int64 multinomial draws
  at::Tensor argmax;      ///< [B, C] int64 argmax of the processed logits
  at::Tensor accepted;    ///< [B, C] bool  entropy-bound acceptance
  at::Tensor entropy;     ///< [B, C] fp32  entropy of the processed logits
  at::Tensor finished;    ///< [B] bool     rows whose denoising has stopped
};

/// Called after every denoising step; may return false to cancel.
using StepObserver = std::function<void(const StepRecord&)>;

/// Everything a generation run needs besides the model and the prompt.
struct GenerateOptions {
  std::int64_t batch_size = 1;
  std::uint64_t seed = 0;
  RngMode rng = RngMode::PerRow;
  PrefillMode prefill = PrefillMode::Copied;
  GenerationConfig config;
  const ops::OpPolicy* policy = nullptr;      ///< null = default
  const base::CancelToken* cancel = nullptr;  ///< checked before every step
  StepObserver on_step;                       ///< optional
};

/// What one row produced.
struct RowOutcome {
  std::vector<std::int64_t> tokens;  ///< generated tokens (all canvases; pads after EOS)
  std::int64_t stop_position = -1;   ///< index of the first EOS in `tokens`, -1 without one
  std::vector<int> steps;            ///< denoising steps taken per canvas
};

struct GenerationResult {
  at::Tensor sequences;          ///< [B, L + canvases * C] int64 CPU: prompt + canvases
  std::vector<RowOutcome> rows;  ///< one per row
  int canvases = 0;
};

/// Generates for `prompt` [1, L] int64 repeated to options.batch_size bitwise-identical rows.
/// Throws base::ErrorException (InvalidArgument, Cancelled) and c10 errors (OutOfMemory).
/// ref: DiffusionGemmaGenerationMixin.generate, _denoising_step, _finalize_canvas
GenerationResult generate(const model::DiffusionGemma& model, const at::Tensor& prompt,
                          const GenerateOptions& options);

}  // namespace batchlens::sampling
