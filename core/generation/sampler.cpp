// SPDX-License-Identifier: Apache-2.0
#include "core/generation/sampler.h"

#include <limits>

#include <ATen/ATen.h>

#include "core/base/error.h"
#include "core/compat/torch_compat.h"

namespace batchlens::generation {

at::Tensor temperature(int cur_step, const SamplerConfig& config, const at::Device& device) {
  // The reference turns cur_step into an int32 tensor; int / int true-divides into fp32 and
  // the Python floats join in fp32.
  const at::Tensor step =
      at::scalar_tensor(cur_step, at::TensorOptions().dtype(at::kInt).device(device));
  return config.t_min + ((config.t_max - config.t_min) * (step / config.max_denoising_steps));
}

at::Tensor token_entropy(const at::Tensor& logits) {
  // ref: torch.distributions.Categorical: logits normalised by logsumexp, probs = softmax,
  // entropy = -(clamp(logits, finfo.min) * probs).sum(-1)
  const at::Tensor normalized = logits - logits.logsumexp(-1, /*keepdim=*/true);
  const at::Tensor probs = at::softmax(normalized, -1);
  const double min_real = logits.scalar_type() == at::kDouble
                              ? std::numeric_limits<double>::lowest()
                              : static_cast<double>(std::numeric_limits<float>::lowest());
  const at::Tensor p_log_p = at::clamp(normalized, min_real) * probs;
  return -p_log_p.sum(-1);
}

at::Tensor entropy_bound_mask(const at::Tensor& entropy, double bound) {
  // ref: EntropyBoundSampler.accept_canvas
  const auto [sorted, indices] = at::sort(entropy, -1, /*descending=*/false);
  const at::Tensor cumulative = at::cumsum(sorted, -1);
  const at::Tensor selection = (cumulative - sorted) <= bound;
  return at::scatter(at::zeros_like(selection), -1, indices, selection);
}

std::uint64_t RandomStreams::row_seed(std::uint64_t seed, std::int64_t row) {
  if (row == 0) {
    return seed;  // row 0 draws what a batch-1 run seeded with `seed` draws
  }
  // splitmix64 of (seed, row): independent streams for the other rows.
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ULL * static_cast<std::uint64_t>(row + 1);
  z = (z ^ (z >> 30U)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27U)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31U);
}

RandomStreams::RandomStreams(RngMode mode, std::uint64_t seed, std::int64_t rows,
                             const at::Device& device, std::int64_t lead_row)
    : mode_(mode), rows_(rows) {
  if (rows < 1) {
    base::raise(base::ErrorCode::InvalidArgument, "random streams need at least one row");
  }
  if (lead_row < 0 || lead_row >= rows) {
    base::raise(
        base::ErrorCode::InvalidArgument,
        "random streams: row " + std::to_string(lead_row) + " is outside " + std::to_string(rows));
  }
  if (mode == RngMode::Shared) {
    generators_.push_back(compat::make_generator(device, seed));
  } else {
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t stream = r == lead_row ? 0 : r == 0 ? lead_row : r;
      generators_.push_back(compat::make_generator(device, row_seed(seed, stream)));
    }
  }
}

at::Tensor RandomStreams::randint(std::int64_t high, std::int64_t length) {
  const auto& gen = generators_.front();
  const auto opts = at::TensorOptions().dtype(at::kLong).device(gen.device());
  if (mode_ == RngMode::Shared) {
    return at::randint(0, high, {rows_, length}, gen, opts);
  }
  std::vector<at::Tensor> parts;
  parts.reserve(generators_.size());
  for (const auto& g : generators_) {
    parts.push_back(at::randint(0, high, {1, length}, g, opts));
  }
  return at::cat(parts, 0);
}

at::Tensor RandomStreams::normal(at::IntArrayRef shape) {
  const auto& gen = generators_.front();
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat).device(gen.device()));
}

at::Tensor RandomStreams::multinomial(const at::Tensor& probs) {
  if (mode_ == RngMode::Shared) {
    return at::multinomial(probs, 1, /*replacement=*/false, generators_.front());
  }
  TORCH_CHECK(probs.size(0) % rows_ == 0, "multinomial: ", probs.size(0), " distributions for ",
              rows_, " rows");
  const std::int64_t per_row = probs.size(0) / rows_;
  std::vector<at::Tensor> parts;
  parts.reserve(generators_.size());
  for (std::int64_t r = 0; r < rows_; ++r) {
    parts.push_back(at::multinomial(probs.narrow(0, r * per_row, per_row), 1, false,
                                    generators_[static_cast<std::size_t>(r)]));
  }
  return at::cat(parts, 0);
}

at::Tensor StableConfidentStopping::operator()(const at::Tensor& argmax,
                                               const at::Tensor& processed_logits,
                                               const at::Tensor& entropy) {
  at::Tensor stable;
  if (stability_threshold_ == 0) {
    stable = at::ones({processed_logits.size(0)},
                      at::TensorOptions().dtype(at::kBool).device(processed_logits.device()));
  } else {
    if (!history_.defined()) {
      history_ =
          at::full({stability_threshold_, argmax.size(0), argmax.size(1)}, -1, argmax.options());
    }
    stable = (history_ == argmax.unsqueeze(0)).all(-1).all(0);
    history_ = at::roll(history_, {-1}, {0});
    history_[-1] = argmax;
  }
  const at::Tensor confident =
      (entropy.defined() ? entropy : token_entropy(processed_logits)).mean(-1) <
      confidence_threshold_;
  return stable & confident;
}

}  // namespace batchlens::generation
