// SPDX-License-Identifier: Apache-2.0
#include "core/model/layer_math.h"

#include <ATen/ATen.h>

namespace batchlens::model {

// ref: DiffusionGemmaRMSNorm.forward / _norm
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor mean_squared = xf.pow(2).mean(-1, /*keepdim=*/true) + eps;
  at::Tensor y = xf * at::pow(mean_squared, -0.5);
  if (weight.defined()) {
    y = y * weight.to(at::kFloat);
  }
  return y.to(x.scalar_type());
}

// ref: rotate_half, apply_rotary_pos_emb(unsqueeze_dim=2)
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const std::int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  const at::Tensor c = cos.unsqueeze(2);  // [1 or B, S, 1, D]
  const at::Tensor s = sin.unsqueeze(2);
  return (x * c) + (rotated * s);
}

// ref: DiffusionGemmaTextRotaryEmbedding.compute_default_rope_parameters and
// modeling_rope_utils._compute_proportional_rope_parameters
at::Tensor rope_inv_freq(const RopeParams& rope, std::int64_t head_dim) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  if (rope.rope_type == "proportional") {
    const auto angles =
        static_cast<std::int64_t>(rope.partial_rotary_factor * static_cast<double>(head_dim) / 2.0);
    const at::Tensor exponents =
        at::arange(0, 2 * angles, 2, at::TensorOptions().dtype(at::kLong)).to(at::kFloat) /
        static_cast<double>(head_dim);
    at::Tensor inv = 1.0 / at::pow(rope.rope_theta, exponents);
    const std::int64_t nope = head_dim / 2 - angles;
    if (nope > 0) {
      inv = at::cat({inv, at::zeros({nope}, f32)}, 0);
    }
    inv.div_(rope.factor);
    return inv;
  }
  // default: dim = int(head_dim * partial_rotary_factor)
  const auto dim =
      static_cast<std::int64_t>(static_cast<double>(head_dim) * rope.partial_rotary_factor);
  return 1.0 / at::pow(rope.rope_theta, at::arange(0, dim, 2, f32) / static_cast<double>(dim));
}

std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& inv_freq,
                                              const at::Tensor& positions, at::ScalarType dtype) {
  const at::Tensor pos = positions.dim() == 1 ? positions.view({1, -1}) : positions;  // [P, S]
  // inv_freq[None, :, None].expand(P, -1, 1) @ position_ids[:, None, :]  -> [P, D/2, S]
  const at::Tensor inv =
      inv_freq.unsqueeze(0).unsqueeze(2).expand({pos.size(0), -1, 1}).to(pos.device(), at::kFloat);
  const at::Tensor freqs = at::matmul(inv, pos.unsqueeze(1).to(at::kFloat)).transpose(1, 2);
  const at::Tensor emb = at::cat({freqs, freqs}, -1);  // [P, S, D]
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

}  // namespace batchlens::model
