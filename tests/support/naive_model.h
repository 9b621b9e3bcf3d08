// SPDX-License-Identifier: Apache-2.0
// An independent, deliberately plain fp64 implementation of DiffusionGemma text inference,
// written from the spec (../shared/spec/diffusiongemma.md), for checking the real engine on
// CPU. Per-row, per-head and per-token loops; no shared code with core/model.
#pragma once

#include <ATen/core/Tensor.h>

#include "core/model/config.h"
#include "core/model/weights.h"

namespace batchlens::testing {

/// Logits [B, C, V] (fp64) of one decoder pass over `canvas` [B, C] after an encoder prefill of
/// `prompt` [B, L], with optional self-conditioning logits [B, C, V] (undefined = none).
at::Tensor naive_forward(const model::ModelConfig& config, const model::ModelWeights& weights,
                         const at::Tensor& prompt, const at::Tensor& canvas,
                         const at::Tensor& sc_logits);

/// naive_forward of a left-padded batch: `valid` [B, L] bool marks the prompt's real tokens
/// (padding slots are never attended to), `prompt_positions` [B, L] and `canvas_positions`
/// [B, C] are each token's position id. Causality and the sliding window count slots, padding
/// included, as transformers' masks do.
at::Tensor naive_forward_padded(const model::ModelConfig& config,
                                const model::ModelWeights& weights, const at::Tensor& prompt,
                                const at::Tensor& valid, const at::Tensor& prompt_positions,
                                const at::Tensor& canvas, const at::Tensor& canvas_positions,
                                const at::Tensor& sc_logits);

}  // namespace batchlens::testing
