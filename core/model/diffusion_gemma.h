// SPDX-License-Identifier: Apache-2.0
// The DiffusionGemma model in LibTorch: its encoder (prefill, KV cache) and decoder (one
// denoising step over a canvas), the run settings and forward context, every matmul-like call
// through the op layer. Layer math is layer_math.h; the fused kernels' checks fused_layer.h.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/base/switches.h"
#include "core/model/batch_invariance.h"
#include "core/model/config.h"
#include "core/model/fused_layer.h"
#include "core/model/layer_math.h"
#include "core/model/weights.h"
#include "core/ops/op_observer.h"
#include "core/ops/policy.h"
#include "core/probe/taps.h"

namespace batchlens::model {

/// How experts are computed. ref: transformers integrations/moe.py
enum class ExpertsImpl {
  Eager,      ///< the modeling file's per-expert loop with bf16 index_add_
  GroupedMm,  ///< grouped_mm_experts_forward (torch._grouped_mm; LibTorch 2.8+, CUDA sm90)
};

/// Per-run computation choices (not part of the model).
struct RunSettings {
  ExpertsImpl experts = ExpertsImpl::Eager;
  base::Switches switches;  ///< which fused kernels may be checked and used
};

/// "eager" / "grouped_mm".
const char* experts_impl_name(ExpertsImpl impl);

/// Room after each layer's cached keys and values for one decoder pass (KvCache::room): per
/// layer a tensor [B, Hkv, L_kept + slots, D] whose front is the cache's K (V) and whose last
/// `slots` positions a decoder pass of that many tokens overwrites with its own. Attention then
/// reads the whole tensor, which is what torch.cat([cache, new], -2) makes (the same values in
/// the same layout), without copying the cache in every pass. A copy of a cache has no room
/// (the copy falls back to the concatenation): two caches never write the same slots.
struct KvRoom {
  std::vector<at::Tensor> k;  ///< per layer [B, Hkv, L_kept + slots, D] or undefined
  std::vector<at::Tensor> v;
  std::int64_t slots = 0;  ///< tokens of the decoder pass it is for (the canvas length)

  KvRoom() = default;
  ~KvRoom() = default;
  KvRoom(KvRoom&&) = default;
  KvRoom& operator=(KvRoom&&) = default;
  KvRoom(const KvRoom& /*other*/) {}
  KvRoom& operator=(const KvRoom& other) {
    if (this != &other) {
      k.clear();
      v.clear();
      slots = 0;
    }
    return *this;
  }
};

/// The encoder's KV cache: per layer K and V after norm and RoPE, exactly as attention reads
/// them. Full layers keep every position; sliding layers keep the last sliding_window - 1
/// (HF DynamicSlidingWindowLayer). ref: spec section 4.1
struct KvCache {
  std::vector<at::Tensor> k;    ///< per layer [B, Hkv, L_kept, D] (the front of room.k)
  std::vector<at::Tensor> v;    ///< per layer [B, Hkv, L_kept, D]
  std::int64_t seq_length = 0;  ///< slots seen in all (padding included)
  /// Which of the seq_length slots hold a real token (false: left padding), on the device:
  /// transformers' 2D attention_mask as generate grows it. Undefined: every slot is real.
  at::Tensor valid;     ///< [B, seq_length] bool
  bool padded = false;  ///< some slot is padding (`valid` has a false); known on the host
  /// Made by the encoder (and repeat_rows) for a decoder pass of a canvas; the decoder writes
  /// its keys there, so one decoder pass at a time per cache.
  KvRoom room;

  std::int64_t batch_size() const { return k.empty() ? 0 : k.front().size(0); }
  /// A cache of `rows` rows, each a bitwise copy of row 0 (the batch-1 prompt cache copied into
  /// every row, the user's setup).
  KvCache repeat_rows(std::int64_t rows) const;
};

/// Where one pass's tokens sit in a padded batch: their position ids and which are padding,
/// as transformers' generate passes them (position_ids, the 2D attention_mask). The default is
/// a batch without padding whose positions continue the cache (seq_length + i in every row).
/// ref: DiffusionGemmaGenerationMixin.generate (encoder/decoder position ids, attention_mask)
struct TokenLayout {
  /// [1, S] (one set for every row, transformers' generate) or [B, S] int64 (each row its own).
  /// Undefined: cache.seq_length .. cache.seq_length + S - 1.
  at::Tensor positions;
  /// [B, S] bool: the pass's tokens that are real (false: padding, masked as keys). Encoder
  /// only (a canvas is never padding). Undefined: every token is real.
  at::Tensor valid;
};

/// What one forward pass reports to and is steered by.
struct ForwardContext {
  const ops::OpPolicy* policy = nullptr;  ///< null = default (everything batched)
  probe::TapSink* taps = nullptr;         ///< null = no taps
  /// Range-check token ids against the vocabulary. On a device this reads two values back to
  /// the host (a synchronisation, and impossible inside a CUDA graph capture); the generation
  /// engine, whose ids come from its own sampler, turns it off. Rank and dtype are always
  /// checked.
  bool check_id_range = true;
  /// Use the fused elementwise kernels the model checked at load (fused_kernels()); false runs
  /// every op as transformers does, one ATen call each. Both give the same bits.
  bool fused_kernels = true;
  /// Hears of every op call of the pass (ops::OpObserver): kernel provenance. Null: none.
  ops::OpObserver* observer = nullptr;
};

/// DiffusionGemma text inference in LibTorch: the encoder (prefill / commit, writes the KV
/// cache) and the decoder (one denoising step over a canvas, reads the cache), with the
/// reference's dtype choreography. Every matmul-like call goes through ops::OpRunner.
/// ref: DiffusionGemmaForBlockDiffusion (transformers 5.17). Thread-compatible: one thread
/// per forward; weights are shared read-only.
class DiffusionGemma {
 public:
  /// Throws base::ErrorException(InvalidArgument) if the settings cannot run on the weights'
  /// device (e.g. grouped_mm without LibTorch 2.8 + CUDA).
  DiffusionGemma(ModelConfig config, ModelWeights weights, RunSettings settings = {});

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const RunSettings& settings() const { return settings_; }
  /// Which fused CUDA kernels passed their bitwise check against ATen at load (none on CPU).
  const FusedKernels& fused_kernels() const { return fused_; }
  /// Which op families the batch_invariant strategy keeps row 0 bitwise equal for, measured on
  /// this model's weights and shapes at the first call (model/batch_invariance.h); a forward
  /// whose policy gives an unproven family that strategy is refused. Thread-safe.
  const BatchInvariance& batch_invariance() const;
  at::Device device() const { return weights_.device(); }
  at::ScalarType dtype() const { return weights_.dtype(); }

  /// Encoder pass over `ids` [B, L] int64 (causal), appending to `cache` (empty for prefill;
  /// B must match a non-empty cache). Positions and padding from `layout` (default: positions
  /// continue at cache.seq_length, no padding). Keys at padding slots are masked, as
  /// transformers' create_causal_mask / create_sliding_window_causal_mask do.
  /// ref: DiffusionGemmaEncoderTextModel.forward
  void encode(const at::Tensor& ids, KvCache& cache, const ForwardContext& ctx = {},
              const TokenLayout& layout = {}) const;

  /// One decoder pass: canvas [B, C] int64, the cache (B rows; its cached keys are read only,
  /// its room (KvRoom) takes this pass's, so one pass at a time per cache), optional
  /// self-conditioning logits [B, C, V] (the previous step's processed logits, any float
  /// dtype; undefined on the first step). Returns soft-capped logits [B, C, V] fp32.
  /// `positions` [1, C] or [B, C] int64: the canvas's position ids (undefined: seq_length + i).
  /// With padding in the cache every layer masks the padding slots among its keys.
  /// ref: DiffusionGemmaDecoderModel.forward + DiffusionGemmaForBlockDiffusion.forward,
  /// create_diffusion_decoder_attention_mask
  at::Tensor decode(const at::Tensor& canvas, const KvCache& cache,
                    const at::Tensor& self_conditioning_logits, const ForwardContext& ctx = {},
                    const at::Tensor& positions = {}) const;

 private:
  ModelConfig config_;
  ModelWeights weights_;
  RunSettings settings_;
  at::Tensor embed_scale_;       // 0-dim, model dtype: bf16(sqrt(H)) (53.0 for H = 2816)
  at::Tensor inv_freq_sliding_;  // [D/2] fp32
  at::Tensor inv_freq_full_;     // [Dg/2] fp32
  FusedKernels fused_;
  struct InvarianceOnce;
  std::shared_ptr<InvarianceOnce> invariance_;  // measured once, shared by copies
};

/// LibTorch sends CPU bf16 matmuls to oneDNN when its own CPU check (AVX-512 BW/VL/DQ) passes;
/// a oneDNN limited below that (ONEDNN_MAX_CPU_ISA=AVX2, e.g. to emulate an older CPU) then
/// refuses them ("could not create a primitive descriptor iterator"). Probes once per process
/// and in that case turns LibTorch's oneDNN use off, so that bf16 runs on ATen's own kernels as
/// on a CPU without AVX-512. Returns whether that fallback is in use. The DiffusionGemma
/// constructor calls it for CPU bf16 models. Thread-safe.
bool ensure_cpu_bf16_matmul();

}  // namespace batchlens::model
