// SPDX-License-Identifier: Apache-2.0
// The pieces of DiffusionGemma's block-diffusion sampler, ported from transformers 5.17's
// generation_diffusion_gemma.py: linear temperature schedule, entropy-bound acceptance,
// renoising, stable-and-confident stopping, and the random streams that feed them.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include "core/generation/generation_config.h"
#include "core/generation/modes.h"

namespace batchlens::generation {

/// The temperature at `cur_step` (counting down N .. 1) as the reference computes it: a 0-dim
/// fp32 tensor t_min + (t_max - t_min) * (int32(cur_step) / N) on `device`.
/// ref: LinearTemperatureScheduleLogitsProcessor.__call__ with cur_step as an int32 tensor
at::Tensor temperature(int cur_step, const SamplerConfig& config, const at::Device& device);

/// Per-position entropy (nats) of softmax(logits) over the last dim, fp32, as
/// torch.distributions.Categorical(logits=...).entropy(). logits [B, C, V] -> [B, C].
at::Tensor token_entropy(const at::Tensor& logits);

/// Entropy-bound acceptance: per row, accept the k lowest-entropy positions with
/// sum(H_1..k) - H_k <= bound (the lowest is always accepted). entropy [B, C] -> bool [B, C].
/// ref: EntropyBoundSampler.accept_canvas
at::Tensor entropy_bound_mask(const at::Tensor& entropy, double bound);

/// The random streams of one batch. Not thread-safe; one per generation.
class RandomStreams {
 public:
  /// Generators on `device` (CPU or CUDA), seeded as RngMode says. Per row, row `lead_row`
  /// draws row 0's stream and row 0 draws row `lead_row`'s (a mixed batch's row under test draws
  /// what its prompt alone draws at B=1).
  RandomStreams(RngMode mode, std::uint64_t seed, std::int64_t rows, const at::Device& device,
                std::int64_t lead_row = 0);

  RngMode mode() const { return mode_; }
  std::int64_t rows() const { return rows_; }
  /// Uniform token ids [rows, length] in [0, high): torch.randint(0, high, (B, length)).
  at::Tensor randint(std::int64_t high, std::int64_t length);
  /// One draw per row of probs [rows * C, V] (rows laid out by logical row), as
  /// torch.multinomial(probs, 1). Returns int64 [rows * C, 1].
  at::Tensor multinomial(const at::Tensor& probs);
  /// Standard normal fp32 values of `shape` on the streams' device, from the first stream
  /// (inputs that only need to be seeded, such as kernel provenance's self-conditioning).
  at::Tensor normal(at::IntArrayRef shape);

  /// The seed of row r's generator in per-row mode.
  static std::uint64_t row_seed(std::uint64_t seed, std::int64_t row);

 private:
  RngMode mode_;
  std::int64_t rows_;
  std::vector<at::Generator> generators_;  // one (shared) or one per row
};

/// Stable-and-confident adaptive stopping, stateful across the steps of one canvas.
/// ref: StableAndConfidentStoppingCriteria
class StableConfidentStopping {
 public:
  StableConfidentStopping(int stability_threshold, double confidence_threshold)
      : stability_threshold_(stability_threshold), confidence_threshold_(confidence_threshold) {}
  /// argmax [B, C] int64 and the processed (temperature-scaled) logits [B, C, V] -> bool [B]:
  /// the argmax equals each of the last `stability_threshold` argmax canvases AND the mean
  /// entropy is below the confidence threshold. `entropy` [B, C] fp32, when given, is
  /// token_entropy(processed_logits) computed before (the sampler's): the reference computes it
  /// twice, and the second pass over [B, C, V] gives the same bits.
  at::Tensor operator()(const at::Tensor& argmax, const at::Tensor& processed_logits,
                        const at::Tensor& entropy = {});
  /// Forgets the history (a new canvas).
  void reset() { history_ = at::Tensor(); }

 private:
  int stability_threshold_;
  double confidence_threshold_;
  at::Tensor history_;  // [s, B, C], starts at -1
};

}  // namespace batchlens::generation
