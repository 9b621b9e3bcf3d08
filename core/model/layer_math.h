// SPDX-License-Identifier: Apache-2.0
// DiffusionGemma's elementwise layer math, ported with the reference's dtype choreography:
// RMSNorm, rotary tables and their application. The model (diffusion_gemma.h) and the fused
// kernels' load-time checks (fused_layer.h) share them.
#pragma once

#include <cstdint>
#include <utility>

#include <ATen/core/Tensor.h>

#include "core/model/config.h"

namespace batchlens::model {

/// Inverse RoPE frequencies of a layer type, computed on the CPU in fp32 as the reference
/// does at init (default: 1 / theta^(arange(0, d, 2) / d); proportional: the rotated
/// 2*floor(p*d/2) dims, then zeros up to d/2, divided by factor).
/// ref: compute_default_rope_parameters, _compute_proportional_rope_parameters
at::Tensor rope_inv_freq(const RopeParams& rope, std::int64_t head_dim);

/// cos and sin tables [P, S, D] in `dtype` for positions [S] (P = 1) or [P, S] (int64): one
/// table for every row (P = 1) or one per row. ref: DiffusionGemmaTextRotaryEmbedding.forward
std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& inv_freq,
                                              const at::Tensor& positions, at::ScalarType dtype);

/// RMSNorm in fp32, x * pow(mean(x^2) + eps, -0.5) [* weight], cast back to x's dtype.
/// `weight` may be undefined (no scale). ref: DiffusionGemmaRMSNorm
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

/// x * cos + rotate_half(x) * sin with cos/sin [1 or B, S, D] broadcast over heads of x
/// [B, S, H, D].
/// ref: apply_rotary_pos_emb(unsqueeze_dim=2)
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace batchlens::model
