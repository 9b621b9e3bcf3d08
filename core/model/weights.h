// SPDX-License-Identifier: Apache-2.0
// DiffusionGemma's parameters as tensors: the checkpoint's key names and shapes checked against
// the config, loaded onto a device in the model's dtype.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/base/cancel.h"
#include "core/base/progress.h"
#include "core/model/config.h"

namespace batchlens::model {

class Checkpoint;

/// One decoder layer's parameters (shared by the encoder, which has its own layer_scalar).
/// Linear weights are [out, in] as nn.Linear stores them. ref: DiffusionGemmaDecoderTextLayer
struct LayerWeights {
  at::Tensor input_layernorm;               // [H]
  at::Tensor q_proj;                        // [Hq*D, H]
  at::Tensor k_proj;                        // [Hkv*D, H]
  at::Tensor v_proj;                        // [Hkv*D, H]; undefined on full layers (k_eq_v)
  at::Tensor o_proj;                        // [H, Hq*D]
  at::Tensor q_norm;                        // [D]
  at::Tensor k_norm;                        // [D]
  at::Tensor post_attention_layernorm;      // [H]
  at::Tensor pre_feedforward_layernorm;     // [H]   dense branch input norm
  at::Tensor mlp_gate;                      // [I, H]
  at::Tensor mlp_up;                        // [I, H]
  at::Tensor mlp_down;                      // [H, I]
  at::Tensor post_feedforward_layernorm_1;  // [H]   dense branch output norm
  at::Tensor pre_feedforward_layernorm_2;   // [H]   MoE branch input norm
  at::Tensor router_scale;                  // [H]
  at::Tensor router_proj;                   // [E, H]
  at::Tensor router_per_expert_scale;       // [E]
  at::Tensor experts_gate_up;               // [E, 2*Im, H] rows 0..Im-1 gate, Im.. up
  at::Tensor experts_down;                  // [E, H, Im]
  at::Tensor post_feedforward_layernorm_2;  // [H]   MoE branch output norm
  at::Tensor post_feedforward_layernorm;    // [H]
  at::Tensor layer_scalar;                  // [1]   decoder copy
  at::Tensor encoder_layer_scalar;          // [1]   encoder copy
};

/// All text-model parameters. The embedding is also the tied lm_head and the
/// self-conditioning matrix E.
struct ModelWeights {
  at::Tensor embed;        // [V, H]
  at::Tensor final_norm;   // [H]
  at::Tensor sc_pre_norm;  // [H]
  at::Tensor sc_gate;      // [I, H]
  at::Tensor sc_up;        // [I, H]
  at::Tensor sc_down;      // [H, I]
  std::vector<LayerWeights> layers;

  /// Device and dtype of the parameters.
  at::Device device() const { return embed.device(); }
  at::ScalarType dtype() const { return embed.scalar_type(); }
  /// Total bytes of all parameters.
  std::int64_t bytes() const;
};

/// One checkpoint key with its expected shape.
struct WeightSpec {
  std::string key;
  std::vector<std::int64_t> shape;
};

/// The keys the released checkpoint holds for a config, in a stable order, with shapes:
/// model.decoder.* (layers, embed_tokens, norm, self_conditioning) and the encoder's
/// model.encoder.language_model.layers.N.layer_scalar copies. ref: spec section 7.
std::vector<WeightSpec> weight_specs(const TextConfig& text);

/// The checkpoint key of the parameter whose storage `tensor` views (a transpose or slice of
/// it included), or "" when it is none of them (a weight the model derives at load).
std::string checkpoint_key_of(const ModelWeights& w, const TextConfig& text,
                              const at::Tensor& tensor);

/// Key prefixes that a checkpoint may hold and BatchLens ignores (vision tower and its
/// embedder: BatchLens is text-only).
bool is_ignored_key(const std::string& key);

/// Loads every parameter from a checkpoint onto `device` as `dtype`, tensor by tensor from
/// the memory map (host memory holds at most one tensor's conversion at a time).
/// Throws base::ErrorException(FileCorrupted) listing missing keys, unexpected keys and shape
/// mismatches (expected vs actual); Cancelled when `cancel` fires.
ModelWeights load_weights(const Checkpoint& checkpoint, const ModelConfig& config,
                          const at::Device& device, at::ScalarType dtype,
                          const base::ProgressFn& progress = {},
                          const base::CancelToken* cancel = nullptr);

/// Seeded random parameters following the reference's _init_weights: linear, embedding and
/// expert weights ~ N(0, initializer_range) (embedding pad row zeroed), norms, router scales
/// and layer scalars 1. Each tensor has its own generator seeded from (seed, key), so the
/// result does not depend on order or on which other tensors exist. Deterministic for a
/// (seed, device type, LibTorch version).
ModelWeights random_weights(const ModelConfig& config, std::uint64_t seed, const at::Device& device,
                            at::ScalarType dtype);

/// (key, tensor) pairs in weight_specs order, for write_checkpoint.
std::vector<std::pair<std::string, at::Tensor>> named_tensors(const ModelWeights& weights,
                                                              const TextConfig& text);

}  // namespace batchlens::model
