// SPDX-License-Identifier: Apache-2.0
// DiffusionGemma text inference, ported from transformers 5.17's modeling_diffusion_gemma.py.
// Every op mirrors the reference's ATen call (same op, same operand dtypes and layouts, same
// order), because the goal is bitwise-equal logits where the same kernels run.
#include "core/model/diffusion_gemma.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>

#include "core/base/error.h"
#include "core/compat/device_graph.h"
#include "core/compat/torch_compat.h"
#include "core/kernels/fused_ops.h"
#include "core/ops/op_runner.h"

namespace batchlens::model {

using ops::OpFamily;
using ops::OpSite;
using probe::Tap;

const char* experts_impl_name(ExpertsImpl impl) {
  return impl == ExpertsImpl::GroupedMm ? "grouped_mm" : "eager";
}

KvCache KvCache::repeat_rows(std::int64_t rows) const {
  KvCache out;
  out.seq_length = seq_length;
  out.room.slots = room.slots;
  const auto rep = [&](const at::Tensor& t, std::vector<at::Tensor>& kept,
                       std::vector<at::Tensor>& with_room) {
    // [1, Hkv, L, D] -> [rows, Hkv, L, D], each row a bitwise copy of row 0 (at the front of
    // [rows, Hkv, L + slots, D] where the cache has room).
    const at::Tensor each = t.narrow(0, 0, 1).expand({rows, t.size(1), t.size(2), t.size(3)});
    if (room.slots <= 0) {
      kept.push_back(each.contiguous());
      return;
    }
    at::Tensor whole = at::empty({rows, t.size(1), t.size(2) + room.slots, t.size(3)}, t.options());
    kept.push_back(whole.narrow(2, 0, t.size(2)).copy_(each));
    with_room.push_back(std::move(whole));
  };
  for (std::size_t i = 0; i < k.size(); ++i) {
    rep(k[i], out.k, out.room.k);
    rep(v[i], out.v, out.room.v);
  }
  if (valid.defined()) {
    out.valid = valid.narrow(0, 0, 1).expand({rows, valid.size(1)}).contiguous();
    out.padded = padded;
  }
  return out;
}

namespace {

// The rows one expert computes in the eager loop: token_idx [n] int64 (the tokens routed to
// it), row_of [n] int64 (their logical batch row) and weight [n] fp32 (their router weight);
// token_idx undefined when no token picks the expert.
struct ExpertRows {
  at::Tensor token_idx;
  at::Tensor row_of;
  at::Tensor weight;
};

// The eager loop's routing read off a CPU index [T, K] int64 and weights [T, K] fp32 in one pass:
// for expert e, torch.where(one_hot(index)[..., e].T) lists (top_k_pos, token_idx) row-major over
// [K, T], i.e. slot by slot, tokens ascending within a slot; weight = weights[token_idx,
// top_k_pos]. The same lists as the reference's one_hot / nonzero / where, without their
// per-expert ops. ref: DiffusionGemmaTextExperts.forward
std::vector<ExpertRows> route_on_host(const at::Tensor& index, const at::Tensor& weights,
                                      std::int64_t experts, std::int64_t per_row) {
  const at::Tensor idx = index.contiguous();  // [T, K] int64
  const at::Tensor w = weights.contiguous();  // [T, K] fp32
  const std::int64_t tokens = idx.size(0);
  const std::int64_t top_k = idx.size(1);
  const std::int64_t* ip = idx.data_ptr<std::int64_t>();
  const float* wp = w.data_ptr<float>();
  std::vector<std::vector<std::int64_t>> tok(static_cast<std::size_t>(experts));
  std::vector<std::vector<float>> wt(static_cast<std::size_t>(experts));
  for (std::int64_t k = 0; k < top_k; ++k) {
    for (std::int64_t t = 0; t < tokens; ++t) {
      const std::int64_t e = ip[t * top_k + k];
      TORCH_CHECK(e >= 0 && e < experts, "expert index ", e, " out of range");
      tok[static_cast<std::size_t>(e)].push_back(t);
      wt[static_cast<std::size_t>(e)].push_back(wp[t * top_k + k]);
    }
  }
  std::vector<ExpertRows> out(static_cast<std::size_t>(experts));
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  for (std::size_t e = 0; e < out.size(); ++e) {
    const auto n = static_cast<std::int64_t>(tok[e].size());
    if (n == 0) {
      continue;
    }
    out[e].token_idx = at::empty({n}, i64);
    out[e].row_of = at::empty({n}, i64);
    out[e].weight = at::empty({n}, at::TensorOptions().dtype(at::kFloat));
    auto* tp = out[e].token_idx.data_ptr<std::int64_t>();
    auto* rp = out[e].row_of.data_ptr<std::int64_t>();
    auto* fp = out[e].weight.data_ptr<float>();
    for (std::int64_t i = 0; i < n; ++i) {
      tp[i] = tok[e][static_cast<std::size_t>(i)];
      rp[i] = tp[i] / per_row;
      fp[i] = wt[e][static_cast<std::size_t>(i)];
    }
  }
  return out;
}

// State of one forward pass: the op runner for the policy, the taps, the batch.
class Pass {
 public:
  Pass(const DiffusionGemma& model, const ForwardContext& ctx, std::int64_t rows, bool record_taps)
      : model_(model),
        t_(model.config().text),
        w_(model.weights()),
        policy_(ctx.policy != nullptr ? *ctx.policy : default_policy()),
        runner_(policy_, rows, model.fused_kernels().own_gemms(ctx.fused_kernels), ctx.observer),
        taps_(record_taps ? ctx.taps : nullptr),
        rows_(rows) {
    if (ctx.fused_kernels) {
      use_ = model.fused_kernels();
    }
    const ops::FamilySet wanted = ops::families_with(policy_, ops::Strategy::BatchInvariant);
    if (wanted.any()) {
      const BatchInvariance& bi = model.batch_invariance();
      const ops::FamilySet missing = wanted & ~bi.proven;
      if (missing.any()) {
        std::string names;
        for (int f = 0; f < ops::kOpFamilyCount; ++f) {
          if (missing.test(static_cast<std::size_t>(f))) {
            names += (names.empty() ? "" : ", ") +
                     std::string(ops::family_name(static_cast<ops::OpFamily>(f)));
          }
        }
        base::raise(base::ErrorCode::InvalidArgument,
                    "the batch_invariant strategy is not proven on " + model.device().str() +
                        " for " + names + "; " + bi.report);
      }
    }
  }

  // Which slots (the cache's and this pass's) are real: [B, seq_length + S] bool on the device.
  // Set before the layers run, and only when some slot is padding: undefined, no layer masks
  // (transformers' shortcuts when the 2D mask is all ones).
  void set_slots(at::Tensor valid) { slots_valid_ = std::move(valid); }

  bool wants(Tap tap, int layer) const { return taps_ != nullptr && taps_->wants(tap, layer); }
  // A layer's part may run on a side stream (compat::SideBranch) where that was allowed at load
  // and none of the taps it records is wanted: a tap sink may keep a value it is handed and read
  // it in its own stream order.
  bool branch_free(bool allowed, int layer, std::initializer_list<Tap> taps) const {
    return allowed &&
           std::none_of(taps.begin(), taps.end(), [&](Tap t) { return wants(t, layer); });
  }
  void record(Tap tap, int layer, const at::Tensor& value) const {
    if (wants(tap, layer)) {
      taps_->record(tap, layer, value);
    }
  }
  // record() of a tensor of its own (a copy where `value` is a view that later passes rewrite).
  void record_own(Tap tap, int layer, const at::Tensor& value) const {
    if (wants(tap, layer)) {
      taps_->record(tap, layer, value.contiguous());
    }
  }

  // ref: DiffusionGemmaTextScaledWordEmbedding.forward
  at::Tensor embed(const at::Tensor& ids, const at::Tensor& embed_scale) const {
    return at::embedding(w_.embed, ids, t_.pad_token_id) * embed_scale;
  }

  // --- Elementwise chains: the fused kernel where it was checked at load, else ATen's ops.

  // The fused RMSNorm tail applies to x with these operands (contiguous, x's dtype, device).
  bool fuse_norm(const at::Tensor& x, std::initializer_list<at::Tensor> operands = {}) const {
    if (!use_.norm || !x.is_contiguous()) {
      return false;
    }
    return std::all_of(operands.begin(), operands.end(), [&](const at::Tensor& t) {
      return !t.defined() ||
             (t.is_contiguous() && t.scalar_type() == x.scalar_type() && t.device() == x.device());
    });
  }
  // x.float().pow(2).mean(-1, keepdim=True): one kernel with ATen's reduction order where it
  // was checked and the shape fits; else the square fused and the mean ATen's own kernel.
  at::Tensor mean_sq(const at::Tensor& x) const {
    return mean_fused(x) ? kernels::mean_sq(x, use_.mean_order)
                         : kernels::square(x).mean(-1, /*keepdim=*/true);
  }
  bool mean_fused(const at::Tensor& x) const {
    const std::int64_t n = x.size(-1);
    return use_.mean && kernels::mean_sq_fits(x.numel() / n, n);
  }
  // The mean of squares of a fused norm's result, as the norm was asked for it (ask_result_mean):
  // computed in its own kernel (one pass), from the squares it wrote (want_square, where the
  // one-kernel mean does not apply), or of the result itself (the same bits: the squares are
  // float(result)^2).
  at::Tensor mean_of(const kernels::NormResult& r) const {
    if (r.mean.defined()) {
      return r.mean;
    }
    return r.square.defined() ? r.square.mean(-1, /*keepdim=*/true) : mean_sq(r.out);
  }
  static void ask_result_mean(kernels::NormApply& a, bool squares) {
    if (a.one_pass) {
      a.want_mean = true;
    } else {
      a.want_square = squares;
    }
  }
  kernels::NormApply tail(const at::Tensor& x, const at::Tensor& ms,
                          const at::Tensor& weight) const {
    kernels::NormApply a;
    a.x = x;
    a.mean_sq = ms;
    a.eps = t_.rms_norm_eps;
    a.weight = weight;
    a.vectorized = use_.norm_vec;
    return a;
  }
  // The tail of x's own RMSNorm: x's mean of squares computed in the tail's kernel where the
  // one-pass norm was checked and the shape fits, else by mean_sq first.
  kernels::NormApply tail_of(const at::Tensor& x, const at::Tensor& weight) const {
    if (use_.one_pass && mean_fused(x)) {
      kernels::NormApply a = tail(x, at::Tensor(), weight);
      a.one_pass = true;
      a.mean_order = use_.mean_order;
      return a;
    }
    return tail(x, mean_sq(x), weight);
  }

  // ref: DiffusionGemmaRMSNorm.forward. `into`: see put_into.
  at::Tensor norm(const at::Tensor& x, const at::Tensor& weight,
                  const at::Tensor& into = at::Tensor()) const {
    if (!fuse_norm(x, {weight})) {
      return put_into(rms_norm(x, weight, t_.rms_norm_eps), into);
    }
    kernels::NormApply a = tail_of(x, weight);
    a.into = into;
    return kernels::norm_apply(a).out;
  }
  // With `into` ([B, H, S, D], a view such as a KvRoom's slots), a result y [B, S, H, D] goes
  // there and its view there is returned (the fused norm writes it there itself).
  static at::Tensor put_into(const at::Tensor& y, const at::Tensor& into) {
    if (!into.defined()) {
      return y;
    }
    into.copy_(y.transpose(1, 2));
    return into.transpose(1, 2);
  }

  // rms_norm(x, weight) where x's mean of squares `ms` is already known (fused path); ATen's
  // chain when it is undefined or the fused tail cannot take the operands.
  at::Tensor norm_known(const at::Tensor& x, const at::Tensor& ms, const at::Tensor& weight) const {
    if (!ms.defined() || !fuse_norm(x, {weight})) {
      return rms_norm(x, weight, t_.rms_norm_eps);
    }
    return kernels::norm_apply(tail(x, ms, weight)).out;
  }

  // RMSNorm then RoPE (q and k). ref: DiffusionGemmaDecoderTextAttention.forward
  at::Tensor norm_rope(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos,
                       const at::Tensor& sin, const at::Tensor& into = at::Tensor()) const {
    // The fused kernel takes one table for every row ([1, S, D]); per-row positions ([B, S, D])
    // run ATen's chain (the same bits).
    if (!fuse_norm(x, {weight, cos, sin}) || x.dim() != 4 || cos.size(0) != 1) {
      return put_into(apply_rope(rms_norm(x, weight, t_.rms_norm_eps), cos, sin), into);
    }
    kernels::NormApply a = tail_of(x, weight);
    a.rope_cos = cos;
    a.rope_sin = sin;
    a.into = into;
    return kernels::norm_apply(a).out;
  }

  // gelu_tanh(gate) * up. ref: DiffusionGemmaText4MLP.forward, _default_apply_gate
  at::Tensor gelu_mul(const at::Tensor& gate, const at::Tensor& up) const {
    const bool fits = gate.dim() >= 2 && gate.sizes() == up.sizes() &&
                      gate.scalar_type() == up.scalar_type() && gate.stride(-1) == 1 &&
                      up.stride(-1) == 1;
    if (!use_.gelu || !fits) {
      return gelu_mul_reference(gate, up);
    }
    // [..., I] as rows: a contiguous tensor, or one half of a contiguous [R, 2I] tensor.
    const std::int64_t inter = gate.size(-1);
    const bool rows2d = gate.dim() == 2 && gate.stride(0) == up.stride(0);
    if (!rows2d && !(gate.is_contiguous() && up.is_contiguous())) {
      return gelu_mul_reference(gate, up);
    }
    const at::Tensor g = rows2d ? gate : gate.view({-1, inter});
    const at::Tensor u = rows2d ? up : up.view({-1, inter});
    return kernels::gelu_mul(g, u, use_.gelu_contract, use_.quads).view(gate.sizes());
  }

  // Gated MLP down(gelu_tanh(gate(x)) * up(x)). ref: DiffusionGemmaText4MLP.forward
  at::Tensor gated_mlp(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up,
                       const at::Tensor& down, OpFamily gate_f, OpFamily up_f, OpFamily down_f,
                       int layer) const {
    const at::Tensor g = runner_.linear(x, gate, OpSite{gate_f, layer});
    const at::Tensor u = runner_.linear(x, up, OpSite{up_f, layer});
    return runner_.linear(gelu_mul(g, u), down, OpSite{down_f, layer});
  }

  // tanh(logits.float() / cap) * cap. ref: DiffusionGemmaForBlockDiffusion.forward
  at::Tensor softcap(const at::Tensor& logits, double cap) const {
    if (!use_.softcap || !logits.is_contiguous()) {
      return softcap_reference(logits, cap);
    }
    return kernels::softcap(logits, cap, use_.quads);
  }

  // softmax(scores, -1, float32), topk, the weights normalised and scaled per expert: (weights
  // [T, k] fp32, index [T, k] int64). ref: DiffusionGemmaTextRouter.forward
  std::pair<at::Tensor, at::Tensor> router_topk(const at::Tensor& scores,
                                                const at::Tensor& per_expert_scale) const {
    const std::int64_t k = t_.top_k_experts;
    if (use_.router && scores.dim() == 2 && scores.is_contiguous() &&
        per_expert_scale.scalar_type() == scores.scalar_type() &&
        kernels::router_topk_fits(scores.size(1), k)) {
      return kernels::router_topk(scores, per_expert_scale, k, use_.router_order);
    }
    return router_topk_reference(scores, per_expert_scale, k);
  }

  // softmax(S, -1, float32).to(dtype): the self-conditioning input's probabilities.
  // ref: DiffusionGemmaDecoderModel.forward
  at::Tensor probs(const at::Tensor& s, at::ScalarType dtype) const {
    if (use_.probs && dtype == at::kBFloat16 && s.scalar_type() == at::kBFloat16 &&
        s.is_contiguous() && s.dim() >= 1 && kernels::softmax_probs_fit(s.size(-1))) {
      return kernels::softmax_probs(s, use_.probs_order, use_.probs_threads);
    }
    return at::softmax(s, -1, at::kFloat).to(dtype);
  }

  // The cache's room (KvRoom) takes this decoder pass's K of layer li: made for b rows and s
  // tokens of x's dtype, its front still the cache's keys.
  static bool room_fits(const KvCache& cache, std::size_t li, std::int64_t b, std::int64_t s,
                        const at::Tensor& x) {
    if (cache.room.slots != s || li >= cache.room.k.size() || li >= cache.room.v.size() ||
        !cache.room.k[li].defined() || !cache.room.v[li].defined()) {
      return false;
    }
    const auto fronts = [&](const at::Tensor& whole, const at::Tensor& kept) {
      return whole.size(0) == b && whole.size(2) == kept.size(2) + s &&
             whole.scalar_type() == x.scalar_type() && whole.device() == x.device() &&
             whole.data_ptr() == kept.data_ptr() && kept.stride(2) == whole.stride(2) &&
             kept.stride(1) == whole.stride(1) && kept.stride(0) == whole.stride(0);
    };
    return fronts(cache.room.k[li], cache.k[li]) && fronts(cache.room.v[li], cache.v[li]);
  }

  // The encoder keeps a layer's K and V (kept [B, Hkv, L_kept, D]) at the front of a tensor
  // with room for a decoder pass of a canvas after them (one copy per encoder pass; the decoder
  // then copies the cache in none of its passes).
  void keep_with_room(KvCache& cache, std::size_t li, const at::Tensor& k,
                      const at::Tensor& v) const {
    if (!model_.settings().switches.kv_room()) {
      cache.k[li] = k;
      cache.v[li] = v;
      cache.room = KvRoom();
      return;
    }
    const std::int64_t slots = model_.config().canvas_length;
    const std::size_t layers = cache.k.size();
    if (cache.room.slots != slots || cache.room.k.size() != layers) {
      cache.room.k.assign(layers, at::Tensor());
      cache.room.v.assign(layers, at::Tensor());
      cache.room.slots = slots;
    }
    const auto keep = [&](const at::Tensor& kept, at::Tensor& whole) {
      whole = at::empty({kept.size(0), kept.size(1), kept.size(2) + slots, kept.size(3)},
                        kept.options());
      return whole.narrow(2, 0, kept.size(2)).copy_(kept);
    };
    cache.k[li] = keep(k, cache.room.k[li]);
    cache.v[li] = keep(v, cache.room.v[li]);
  }

  // ref: DiffusionGemma{Encoder,Decoder}TextAttention.forward + sdpa_attention_forward
  at::Tensor attention(const LayerWeights& lw, int layer, const at::Tensor& h,
                       const at::Tensor& cos, const at::Tensor& sin, KvCache& cache,
                       bool encoder) const {
    const std::int64_t b = h.size(0);
    const std::int64_t s = h.size(1);
    const std::int64_t d = t_.layer_head_dim(layer);
    const bool sliding = t_.is_sliding(layer);

    // Q on a side stream while K and V (with the cache's keys before them) run: neither reads
    // the other's results. The calls keep the reference's order (q, k, v).
    compat::SideBranch q_branch(h.device(), branch_free(use_.q_branch, layer, {Tap::AttnQ}));
    at::Tensor q;
    q_branch.run([&] {
      q = runner_.linear(h, lw.q_proj, OpSite{OpFamily::QProj, layer}).view({b, s, -1, d});
      q = norm_rope(q, lw.q_norm, cos, sin);  // [B, S, Hq, D]
      record(Tap::AttnQ, layer, q);
      q = q.transpose(1, 2);  // [B, Hq, S, D]
    });

    const at::Tensor k_raw =
        runner_.linear(h, lw.k_proj, OpSite{OpFamily::KProj, layer}).view({b, s, -1, d});
    // Full layers have no v_proj: V comes from the same projection as K ("k_eq_v").
    const at::Tensor v_raw =
        lw.v_proj.defined()
            ? runner_.linear(h, lw.v_proj, OpSite{OpFamily::VProj, layer}).view({b, s, -1, d})
            : k_raw;
    const auto li = static_cast<std::size_t>(layer);
    const bool has_past = cache.seq_length > 0;
    // The decoder's K and V go into the room after the cache's where it has one for this pass
    // (KvRoom): the keys attention reads are then the room's whole tensor.
    const bool in_room = !encoder && has_past && room_fits(cache, li, b, s, k_raw);
    const at::Tensor k_into = in_room ? cache.room.k[li].narrow(2, cache.k[li].size(2), s)
                                      : at::Tensor();  // [B, Hkv, S, D]
    const at::Tensor v_into =
        in_room ? cache.room.v[li].narrow(2, cache.v[li].size(2), s) : at::Tensor();
    at::Tensor k = norm_rope(k_raw, lw.k_norm, cos, sin, k_into);  // [B, S, Hkv, D]
    at::Tensor v = norm(v_raw, at::Tensor(), v_into);              // [B, S, Hkv, D]
    // A view of the room is overwritten by the next pass: a sink gets a tensor of its own.
    record_own(Tap::AttnK, layer, k);
    record_own(Tap::AttnV, layer, v);
    k = k.transpose(1, 2);  // [B, Hkv, S, D]
    v = v.transpose(1, 2);

    at::Tensor keys = k;
    at::Tensor values = v;
    if (in_room) {
      keys = cache.room.k[li];  // [B, Hkv, L_kept + S, D]: torch.cat([cache, k], -2)'s values
      values = cache.room.v[li];
    } else if (has_past) {
      // Encoder: DynamicLayer / DynamicSlidingWindowLayer.update; decoder: append_to_cache.
      keys = at::cat({cache.k[li], k}, -2);
      values = at::cat({cache.v[li], v}, -2);
    } else if (encoder) {
      // torch.cat([empty, new]) in the cache update: a fresh copy with the same values.
      keys = at::cat({k}, -2);
      values = at::cat({v}, -2);
    }
    q_branch.join({q});

    // Masks, over cache slots (q_idx and kv_idx count every slot, padding included). Without
    // padding the decoder attends to everything (mask None) and the encoder is causal (plus a
    // window on sliding layers): transformers passes no mask and is_causal=True when it can (no
    // past, and on sliding layers fewer keys than the window), else a boolean mask. With
    // padding, keys at padding slots are masked too: in the encoder whenever its keys hold one,
    // in the decoder on every layer once any slot of the batch is padding.
    // ref: masking_utils.sdpa_mask, _ignore_causal_mask_sdpa, padding_mask_function;
    // create_diffusion_decoder_attention_mask (its shortcut: decoder_attention_mask.all())
    const std::int64_t kv_len = keys.size(2);
    const std::int64_t kv_first = cache.seq_length + s - kv_len;  // slot of the first key
    at::Tensor key_valid;                                         // [B, 1, 1, Kv] bool
    if (slots_valid_.defined()) {
      key_valid = slots_valid_.narrow(1, kv_first, kv_len).view({b, 1, 1, kv_len});
    }
    at::Tensor mask;
    bool is_causal = false;
    if (encoder) {
      // Without past the keys are every slot, so "the keys hold padding" is "the batch does".
      const bool skip =
          !has_past && (!sliding || kv_len < t_.sliding_window) && !key_valid.defined();
      if (skip) {
        is_causal = s > 1;
      } else {
        const auto lopt = at::TensorOptions().dtype(at::kLong).device(h.device());
        const at::Tensor q_pos = at::arange(cache.seq_length, cache.seq_length + s, lopt);
        const at::Tensor k_pos = at::arange(kv_first, cache.seq_length + s, lopt);
        at::Tensor m = k_pos.unsqueeze(0) <= q_pos.unsqueeze(1);  // [S, Kv]
        if (sliding) {
          m = m & (k_pos.unsqueeze(0) > (q_pos.unsqueeze(1) - t_.sliding_window));
        }
        mask = m.unsqueeze(0).unsqueeze(0).expand({b, 1, s, kv_len});
        if (key_valid.defined()) {
          mask = mask & key_valid;  // [B, 1, S, Kv]
        }
      }
    } else if (key_valid.defined()) {
      // Materialised, as transformers' and_masks broadcast makes it (kernels see its strides).
      mask = key_valid.expand({b, 1, s, kv_len}).contiguous();
    }
    const std::int64_t groups = t_.num_attention_heads / t_.layer_kv_heads(layer);
    // ref: sdpa_attention_forward / use_gqa_in_sdpa
    bool enable_gqa = false;
    at::Tensor k_att = keys;
    at::Tensor v_att = values;
    if (groups > 1) {
      if (!mask.defined() && d <= 256) {
        enable_gqa = true;
      } else {
        k_att = compat::repeat_kv(keys, groups);
        v_att = compat::repeat_kv(values, groups);
      }
    }
    const at::Tensor attn =
        runner_.attention(q, k_att, v_att, mask, /*scale=*/1.0, is_causal, enable_gqa, layer);
    const at::Tensor out = attn.transpose(1, 2).contiguous().reshape({b, s, -1}).contiguous();
    record(Tap::AttnOut, layer, out);
    at::Tensor o = runner_.linear(out, lw.o_proj, OpSite{OpFamily::OProj, layer});
    record(Tap::AttnOProj, layer, o);

    if (encoder) {
      const std::int64_t keep =
          sliding ? std::min<std::int64_t>(keys.size(2), t_.sliding_window - 1) : keys.size(2);
      keep_with_room(cache, li, keys.narrow(2, keys.size(2) - keep, keep),
                     values.narrow(2, values.size(2) - keep, keep));
    }
    return o;
  }

  // ref: DiffusionGemmaTextRouter.forward. Returns (top_k_weights fp32, top_k_index int64).
  // flat_ms: flat's mean of squares when the caller has it (fused path), else undefined.
  std::pair<at::Tensor, at::Tensor> router(const LayerWeights& lw, int layer,
                                           const at::Tensor& flat,
                                           const at::Tensor& flat_ms) const {
    const double scalar_root_size = std::pow(static_cast<double>(t_.hidden_size), -0.5);
    at::Tensor r;
    if (flat_ms.defined() && fuse_norm(flat, {lw.router_scale})) {
      kernels::NormApply a = tail(flat, flat_ms, at::Tensor());
      a.scale = lw.router_scale;
      a.scalar = scalar_root_size;
      r = kernels::norm_apply(a).out;
    } else {
      r = router_input_reference(flat, lw.router_scale, scalar_root_size, t_.rms_norm_eps);
    }
    const at::Tensor scores =
        runner_.linear(r, lw.router_proj, OpSite{OpFamily::RouterProj, layer});
    record(Tap::RouterScores, layer, scores.view({rows_, -1, scores.size(-1)}));
    const auto [weights, index] = router_topk(scores, lw.router_per_expert_scale);
    record(Tap::RouterTopkIds, layer, index.view({rows_, -1, index.size(-1)}));
    record(Tap::RouterTopkWeights, layer, weights.view({rows_, -1, weights.size(-1)}));
    return {weights, index};
  }

  // ref: DiffusionGemmaTextExperts.forward (the modeling file's eager loop). The routing (which
  // experts are hit, torch.where over each expert's [K, T] mask) is host bookkeeping: on a CPU
  // it is read straight off the index (route_on_host), elsewhere it runs as the reference's ops.
  // Either way every hit expert, in ascending order, runs the same ops on the same rows in the
  // same order, and adds into final_states in that order.
  // `before_gemms` runs before the first expert GEMM is launched (a side branch's join).
  at::Tensor experts_eager(const LayerWeights& lw, int layer, const at::Tensor& x,
                           const at::Tensor& index, const at::Tensor& weights,
                           const std::function<void()>& before_gemms) const {
    before_gemms();
    const std::int64_t experts = t_.num_experts;
    const std::int64_t per_row = x.size(0) / rows_;
    at::Tensor final_states = at::zeros_like(x);  // [T, H]
    const auto run_expert = [&](std::int64_t e, const ExpertRows& r) {
      const at::Tensor current = x.index_select(0, r.token_idx);  // [n, H]
      const auto gate_up = runner_
                               .linear_rows(current, lw.experts_gate_up[e], r.row_of,
                                            OpSite{OpFamily::ExpertGateUp, layer})
                               .chunk(2, -1);
      at::Tensor h = gelu_mul_reference(gate_up[0], gate_up[1]);  // [n, I]
      h = runner_.linear_rows(h, lw.experts_down[e], r.row_of, OpSite{OpFamily::ExpertDown, layer});
      h = h * r.weight.unsqueeze(-1);  // [n, H] bf16 * [n, 1] fp32 -> fp32
      final_states.index_add_(0, r.token_idx, h.to(final_states.scalar_type()));
    };
    if (index.is_cpu() && weights.is_cpu() && index.scalar_type() == at::kLong &&
        weights.scalar_type() == at::kFloat && index.dim() == 2) {
      const std::vector<ExpertRows> routes = route_on_host(index, weights, experts, per_row);
      for (std::int64_t e = 0; e < experts; ++e) {
        const ExpertRows& r = routes[static_cast<std::size_t>(e)];
        if (r.token_idx.defined()) {
          run_expert(e, r);
        }
      }
      return final_states;
    }
    const at::Tensor expert_mask = at::one_hot(index, experts).permute({2, 1, 0});     // [E, K, T]
    const at::Tensor hit = at::greater(expert_mask.sum({-1, -2}), 0).nonzero().cpu();  // [n, 1]
    const auto hit_acc = hit.accessor<std::int64_t, 2>();
    for (std::int64_t i = 0; i < hit.size(0); ++i) {
      const std::int64_t e = hit_acc[i][0];
      const auto where = at::where(expert_mask[e]);
      ExpertRows r;
      r.token_idx = where[1];
      r.row_of = at::div(r.token_idx, per_row, "floor");
      r.weight = weights.index({r.token_idx, where[0]});
      run_expert(e, r);
    }
    return final_states;
  }

  // ref: transformers integrations/moe.py grouped_mm_experts_forward
  // `before_gemms` runs once the routing is launched, before the GEMMs (a side branch's join).
  at::Tensor experts_grouped(const LayerWeights& lw, int layer, const at::Tensor& x,
                             const at::Tensor& index, const at::Tensor& weights,
                             const std::function<void()>& before_gemms) const {
    const std::int64_t experts = t_.num_experts;
    const std::int64_t tokens = x.size(0);
    const std::int64_t hidden = x.size(-1);
    // Sort the (token, slot) pairs by expert; the batch row of each is needed only when a
    // GEMM runs per row.
    const bool per_row =
        rows_ > 1 &&
        (runner_.strategy(OpSite{OpFamily::ExpertGateUp, layer}) == ops::Strategy::RowWise ||
         runner_.strategy(OpSite{OpFamily::ExpertDown, layer}) == ops::Strategy::RowWise);
    const std::int64_t row_count = per_row ? rows_ : 0;
    const kernels::Route route =
        use_.route && index.is_contiguous() && kernels::route_fits(index.numel(), experts)
            ? kernels::route(index, experts, row_count)
            : route_reference(index, experts, row_count);
    const at::Tensor& perm = route.perm;
    const at::Tensor& offsets = route.offsets;
    const at::Tensor& row_of = route.row_of;
    const at::Tensor selected = x.index({route.token_of});
    before_gemms();
    at::Tensor proj = runner_.grouped_mm(selected.to(lw.experts_gate_up.scalar_type()),
                                         lw.experts_gate_up.transpose(-2, -1), offsets, row_of,
                                         OpSite{OpFamily::ExpertGateUp, layer});
    const auto gate_up = proj.chunk(2, -1);
    proj = gelu_mul(gate_up[0], gate_up[1]);
    proj = runner_.grouped_mm(proj.to(lw.experts_down.scalar_type()),
                              lw.experts_down.transpose(-2, -1), offsets, row_of,
                              OpSite{OpFamily::ExpertDown, layer});  // [S, H]
    // Weighted by the router, back in token order, summed over top-k.
    if (use_.combine && proj.is_contiguous() && proj.scalar_type() == x.scalar_type() &&
        weights.is_contiguous() && weights.scalar_type() == at::kFloat && proj.size(-1) == hidden &&
        weights.size(0) == tokens) {
      return kernels::moe_combine(proj, weights, perm, use_.combine_lanes, use_.quads);
    }
    return moe_combine_reference(proj, weights, perm, x.scalar_type());
  }

  // ref: DiffusionGemma{Encoder,Decoder}TextLayer.forward
  at::Tensor layer(int layer, at::Tensor x, const at::Tensor& cos, const at::Tensor& sin,
                   KvCache& cache, bool encoder, bool attention_only) const {
    const LayerWeights& lw = w_.layers[static_cast<std::size_t>(layer)];
    const double eps = t_.rms_norm_eps;

    at::Tensor residual = x;
    at::Tensor h = norm(x, lw.input_layernorm);
    h = attention(lw, layer, h, cos, sin, cache, encoder);
    if (attention_only) {
      return x;  // the encoder's last layer: only its K/V are ever read
    }
    // x = residual + post_attention_layernorm(h). Fused, the same kernel also squares the new
    // x for the three norms that read it (pre_feedforward_layernorm{,_2} and the router's),
    // which in ATen compute the very same mean three times.
    at::Tensor x_ms;  // [B, S, 1] fp32, fused path only
    if (fuse_norm(h, {lw.post_attention_layernorm, residual})) {
      kernels::NormApply a = tail_of(h, lw.post_attention_layernorm);
      a.residual = residual;
      ask_result_mean(a, !mean_fused(h));
      kernels::NormResult r = kernels::norm_apply(a);
      x = r.out;
      x_ms = mean_of(r);
    } else {
      h = rms_norm(h, lw.post_attention_layernorm, eps);
      x = residual + h;
    }

    residual = x;
    // The dense MLP on a side stream while the router and the experts' routing run: the two
    // read only the residual (and its mean of squares) until their sum below. The join comes
    // before the experts' GEMMs: beside them the MLP's kernels only slowed them down (H100).
    compat::SideBranch mlp_branch(x.device(), branch_free(use_.mlp_branch, layer, {Tap::MlpOut}));
    at::Tensor h1;
    mlp_branch.run([&] {
      at::Tensor m = norm_known(x, x_ms, lw.pre_feedforward_layernorm);
      m = gated_mlp(m, lw.mlp_gate, lw.mlp_up, lw.mlp_down, OpFamily::MlpGate, OpFamily::MlpUp,
                    OpFamily::MlpDown, layer);
      record(Tap::MlpOut, layer, m);
      h1 = norm(m, lw.post_feedforward_layernorm_1);
    });

    // The router sees the raw residual; the experts its pre_feedforward_layernorm_2.
    const at::Tensor flat = residual.reshape({-1, residual.size(-1)});
    const at::Tensor flat_ms = x_ms.defined() ? x_ms.view({-1, 1}) : at::Tensor();
    const at::Tensor for_experts = norm_known(flat, flat_ms, lw.pre_feedforward_layernorm_2);
    const auto [weights, index] = router(lw, layer, flat, flat_ms);
    const auto before_gemms = [&] {
      mlp_branch.join({h1});
    };
    at::Tensor h2 = model_.settings().experts == ExpertsImpl::GroupedMm
                        ? experts_grouped(lw, layer, for_experts, index, weights, before_gemms)
                        : experts_eager(lw, layer, for_experts, index, weights, before_gemms);
    h2 = h2.reshape(residual.sizes());
    record(Tap::MoeOut, layer, h2);
    const at::Tensor& layer_scalar = encoder ? lw.encoder_layer_scalar : lw.layer_scalar;
    if (fuse_norm(h2, {lw.post_feedforward_layernorm_2, h1, lw.post_feedforward_layernorm, residual,
                       layer_scalar})) {
      // h = h1 + post_feedforward_layernorm_2(h2); x = residual + post_feedforward_layernorm(h);
      // x *= layer_scalar: two kernels (with the one-pass norm the first computes h2's mean and
      // the second's; else the one-kernel means, or ATen's, beside them).
      kernels::NormApply a = tail_of(h2, lw.post_feedforward_layernorm_2);
      a.residual = h1;
      ask_result_mean(a, !mean_fused(h2));
      const kernels::NormResult r = kernels::norm_apply(a);
      kernels::NormApply b = tail(r.out, mean_of(r), lw.post_feedforward_layernorm);
      b.residual = residual;
      b.layer_scalar = layer_scalar;
      x = kernels::norm_apply(b).out;
    } else {
      h2 = rms_norm(h2, lw.post_feedforward_layernorm_2, eps);
      h = h1 + h2;
      h = rms_norm(h, lw.post_feedforward_layernorm, eps);
      x = residual + h;
      x.mul_(layer_scalar);
    }
    record(Tap::LayerOut, layer, x);
    return x;
  }

  const ops::OpRunner& runner() const { return runner_; }

 private:
  static const ops::OpPolicy& default_policy() {
    static const ops::OpPolicy policy = ops::OpPolicy::default_policy();
    return policy;
  }

  const DiffusionGemma& model_;
  const TextConfig& t_;
  const ModelWeights& w_;
  const ops::OpPolicy& policy_;
  ops::OpRunner runner_;
  probe::TapSink* taps_;
  std::int64_t rows_;
  at::Tensor slots_valid_;  // [B, seq_length + S] bool, undefined without padding
  FusedKernels use_;        // all false unless the context allows them
};

// On a CPU the forward pass runs below LibTorch's autograd and ADInplaceOrView dispatch keys:
// nothing here needs gradients (weights never require them), and every op then skips two
// dispatch hops and their bookkeeping. Kernels and results are the same; tensors leaving the
// pass are ordinary tensors (unlike c10::InferenceMode's). Other devices: untouched.
class HostDispatch {
 public:
  explicit HostDispatch(const at::Device& device) {
    if (device.is_cpu()) {
      guard_.emplace();
    }
  }

 private:
  std::optional<at::AutoDispatchBelowADInplaceOrView> guard_;
};

void check_ids(const at::Tensor& ids, std::int64_t vocab, const char* what, bool range) {
  if (ids.dim() != 2 || ids.scalar_type() != at::kLong) {
    base::raise(base::ErrorCode::InvalidArgument,
                std::string(what) + ": expected int64 [batch, length], got " +
                    std::string(c10::toString(ids.scalar_type())) + " of rank " +
                    std::to_string(ids.dim()));
  }
  if (range && ids.numel() > 0) {
    const auto lo = ids.min().item<std::int64_t>();
    const auto hi = ids.max().item<std::int64_t>();
    if (lo < 0 || hi >= vocab) {
      base::raise(base::ErrorCode::InvalidArgument,
                  std::string(what) + ": token ids must be in [0, " + std::to_string(vocab) +
                      "), got range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
  }
}

// A pass's position ids on `device`: `given` checked ([1, S] or [B, S] integers), else
// first .. first + S - 1 ([S], shared by every row). ref: generate's encoder/decoder_position_ids
at::Tensor pass_positions(const at::Tensor& given, std::int64_t b, std::int64_t s,
                          std::int64_t first, const at::Device& device, const char* what) {
  if (!given.defined()) {
    return at::arange(first, first + s, at::TensorOptions().dtype(at::kLong).device(device));
  }
  if (given.dim() != 2 || (given.size(0) != 1 && given.size(0) != b) || given.size(1) != s ||
      !at::isIntegralType(given.scalar_type(), /*includeBool=*/false)) {
    base::raise(base::ErrorCode::InvalidArgument,
                std::string(what) + ": position ids must be integers of shape [1, " +
                    std::to_string(s) + "] or [" + std::to_string(b) + ", " + std::to_string(s) +
                    "], got " + std::string(c10::toString(given.scalar_type())) + " " +
                    c10::str(given.sizes()));
  }
  return given.to(device, at::kLong);
}

}  // namespace

struct DiffusionGemma::InvarianceOnce {
  std::once_flag once;
  BatchInvariance value;
};

const BatchInvariance& DiffusionGemma::batch_invariance() const {
  std::call_once(invariance_->once, [this] {
    invariance_->value = measure_batch_invariance(
        InvarianceSubject{config_, weights_, settings_.experts == ExpertsImpl::GroupedMm},
        fused_.own_gemms());
  });
  return invariance_->value;
}

bool ensure_cpu_bf16_matmul() {
  static std::once_flag once;
  static bool fallback = false;
  std::call_once(once, [] {
    // Big enough for LibTorch to pick oneDNN (a tiny product takes ATen's path either way).
    const auto probe = [] {
      const at::Tensor a = at::ones({1, 64, 128}, at::TensorOptions().dtype(at::kBFloat16));
      (void)at::linear(a, at::ones({128, 128}, at::TensorOptions().dtype(at::kBFloat16)));
    };
    try {
      probe();
    } catch (const std::exception&) {
      if (!at::globalContext().userEnabledMkldnn()) {
        return;  // not oneDNN's refusal: the model's own calls will report it
      }
      at::globalContext().setUserEnabledMkldnn(false);
      fallback = true;
    }
  });
  return fallback;
}

DiffusionGemma::DiffusionGemma(ModelConfig config, ModelWeights weights, RunSettings settings)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      settings_(std::move(settings)),
      invariance_(std::make_shared<InvarianceOnce>()) {
  validate(config_);
  if (device().is_cpu() && dtype() == at::kBFloat16) {
    ensure_cpu_bf16_matmul();
  }
  if (weights_.layers.size() != static_cast<std::size_t>(config_.text.num_hidden_layers)) {
    base::raise(base::ErrorCode::InvalidArgument,
                "weights have " + std::to_string(weights_.layers.size()) + " layers, config " +
                    std::to_string(config_.text.num_hidden_layers));
  }
  if (settings_.experts == ExpertsImpl::GroupedMm && !ops::grouped_mm_available(device())) {
    base::raise(base::ErrorCode::InvalidArgument,
                "the grouped_mm experts implementation needs LibTorch 2.8+ and a CUDA device; "
                "use eager here");
  }
  // ref: DiffusionGemmaTextScaledWordEmbedding: fp32 buffer hidden_size**0.5, cast to the
  // weight dtype before the multiply (53.0 in bf16 for H = 2816).
  embed_scale_ = at::scalar_tensor(std::sqrt(static_cast<double>(config_.text.hidden_size)),
                                   at::TensorOptions().dtype(at::kFloat))
                     .to(device(), dtype());
  // Computed on the host (as transformers does at init), kept on the device: rope_tables then
  // copies nothing from the host in the step loop (and can run inside a CUDA graph).
  inv_freq_sliding_ = rope_inv_freq(config_.text.rope_sliding, config_.text.head_dim).to(device());
  inv_freq_full_ = rope_inv_freq(config_.text.rope_full, config_.text.global_head_dim).to(device());
  fused_ = check_fused_kernels(config_.text, device(), dtype(), settings_.switches);
}

void DiffusionGemma::encode(const at::Tensor& ids, KvCache& cache, const ForwardContext& ctx,
                            const TokenLayout& layout) const {
  const TextConfig& t = config_.text;
  check_ids(ids, t.vocab_size, "encoder input ids", ctx.check_id_range);
  const std::int64_t b = ids.size(0);
  const std::int64_t s = ids.size(1);
  if (cache.seq_length > 0 && cache.batch_size() != b) {
    base::raise(base::ErrorCode::InvalidArgument, "encoder: cache holds " +
                                                      std::to_string(cache.batch_size()) +
                                                      " rows, ids " + std::to_string(b));
  }
  if (cache.k.empty()) {
    cache.k.resize(static_cast<std::size_t>(t.num_hidden_layers));
    cache.v.resize(static_cast<std::size_t>(t.num_hidden_layers));
  }
  const at::Tensor& given_valid = layout.valid;
  if (given_valid.defined() && (given_valid.scalar_type() != at::kBool || given_valid.dim() != 2 ||
                                given_valid.size(0) != b || given_valid.size(1) != s)) {
    base::raise(base::ErrorCode::InvalidArgument,
                "encoder: the padding mask must be bool [" + std::to_string(b) + ", " +
                    std::to_string(s) + "], got " +
                    std::string(c10::toString(given_valid.scalar_type())) + " " +
                    c10::str(given_valid.sizes()));
  }
  const HostDispatch fast_dispatch(device());
  Pass pass(*this, ctx, b, /*record_taps=*/false);
  const at::Tensor positions =
      pass_positions(layout.positions, b, s, cache.seq_length, device(), "encoder");
  // Which slots are real after this pass: the cache's and the new tokens'. One host read per
  // encoder pass says whether the new tokens hold padding.
  at::Tensor slots;  // [B, seq_length + S] bool, undefined while no slot was ever padding
  bool padded = cache.padded;
  if (cache.valid.defined() || given_valid.defined()) {
    const auto bopt = at::TensorOptions().dtype(at::kBool).device(device());
    const at::Tensor old =
        cache.valid.defined() ? cache.valid : at::ones({b, cache.seq_length}, bopt);
    const at::Tensor cur =
        given_valid.defined() ? given_valid.to(device()) : at::ones({b, s}, bopt);
    padded = padded || !cur.all().item<bool>();
    slots = at::cat({old, cur}, 1);
  }
  if (padded) {
    pass.set_slots(slots);
  }
  const at::Tensor ids_dev = ids.to(device());
  at::Tensor x = pass.embed(ids_dev, embed_scale_);  // [B, S, H]
  const auto [cos_s, sin_s] = rope_tables(inv_freq_sliding_, positions, dtype());
  const auto [cos_f, sin_f] = rope_tables(inv_freq_full_, positions, dtype());
  for (int l = 0; l < static_cast<int>(t.num_hidden_layers); ++l) {
    const bool sliding = t.is_sliding(l);
    const bool last = l == static_cast<int>(t.num_hidden_layers) - 1;
    x = pass.layer(l, x, sliding ? cos_s : cos_f, sliding ? sin_s : sin_f, cache,
                   /*encoder=*/true, /*attention_only=*/last);
  }
  cache.seq_length += s;
  cache.valid = slots;
  cache.padded = padded;
}

at::Tensor DiffusionGemma::decode(const at::Tensor& canvas, const KvCache& cache,
                                  const at::Tensor& self_conditioning_logits,
                                  const ForwardContext& ctx, const at::Tensor& positions) const {
  const TextConfig& t = config_.text;
  check_ids(canvas, t.vocab_size, "canvas", ctx.check_id_range);
  const std::int64_t b = canvas.size(0);
  const std::int64_t c = canvas.size(1);
  if (cache.seq_length <= 0 || cache.batch_size() != b) {
    base::raise(base::ErrorCode::InvalidArgument,
                "decoder: needs a prefilled cache with " + std::to_string(b) + " rows (has " +
                    std::to_string(cache.batch_size()) + " rows, " +
                    std::to_string(cache.seq_length) + " positions)");
  }
  const at::Tensor& sc = self_conditioning_logits;
  if (sc.defined() &&
      (sc.dim() != 3 || sc.size(0) != b || sc.size(1) != c || sc.size(2) != t.vocab_size)) {
    base::raise(base::ErrorCode::InvalidArgument, "self-conditioning logits must be [" +
                                                      std::to_string(b) + ", " + std::to_string(c) +
                                                      ", " + std::to_string(t.vocab_size) + "]");
  }
  if (cache.valid.defined() &&
      (cache.valid.size(0) != b || cache.valid.size(1) != cache.seq_length)) {
    base::raise(base::ErrorCode::InvalidArgument,
                "decoder: the cache's padding mask is " + c10::str(cache.valid.sizes()) + " for " +
                    std::to_string(b) + " rows and " + std::to_string(cache.seq_length) + " slots");
  }
  const HostDispatch fast_dispatch(device());
  Pass pass(*this, ctx, b, /*record_taps=*/true);
  // The canvas continues after everything in the cache (default positions), and is never
  // padding; with padding in the cache every layer masks it among its keys.
  const at::Tensor canvas_positions =
      pass_positions(positions, b, c, cache.seq_length, device(), "decoder");
  if (cache.padded) {
    pass.set_slots(at::cat(
        {cache.valid, at::ones({b, c}, at::TensorOptions().dtype(at::kBool).device(device()))}, 1));
  }
  const at::Tensor canvas_dev = canvas.to(device());
  const at::Tensor inputs_embeds = pass.embed(canvas_dev, embed_scale_);  // [B, C, H]

  // ref: DiffusionGemmaDecoderModel.forward, self-conditioning input
  at::Tensor soft;
  if (sc.defined()) {
    const at::Tensor probs = pass.probs(sc.to(device()), weights_.embed.scalar_type());
    soft = pass.runner().matmul(probs, weights_.embed, OpSite{OpFamily::SelfCondMatmul, -1}) *
           embed_scale_.to(inputs_embeds.scalar_type());
  } else {
    soft = at::zeros_like(inputs_embeds);
  }
  pass.record(Tap::SelfCondSoftEmbed, probe::kNoLayer, soft);
  // ref: DiffusionGemmaSelfConditioning.forward
  const at::Tensor normed = pass.norm(soft, weights_.sc_pre_norm);
  const at::Tensor signal =
      pass.gated_mlp(normed, weights_.sc_gate, weights_.sc_up, weights_.sc_down,
                     OpFamily::SelfCondMlp, OpFamily::SelfCondMlp, OpFamily::SelfCondMlp, -1);
  at::Tensor x = pass.norm(inputs_embeds + signal, at::Tensor());
  pass.record(Tap::SelfCondOut, probe::kNoLayer, x);

  const auto [cos_s, sin_s] = rope_tables(inv_freq_sliding_, canvas_positions, dtype());
  const auto [cos_f, sin_f] = rope_tables(inv_freq_full_, canvas_positions, dtype());
  // The decoder writes its keys into the cache's room (KvRoom), never the cached ones.
  auto& with_room = const_cast<KvCache&>(cache);
  for (int l = 0; l < static_cast<int>(t.num_hidden_layers); ++l) {
    const bool sliding = t.is_sliding(l);
    x = pass.layer(l, x, sliding ? cos_s : cos_f, sliding ? sin_s : sin_f, with_room,
                   /*encoder=*/false, /*attention_only=*/false);
  }
  const at::Tensor h = pass.norm(x, weights_.final_norm);
  // ref: DiffusionGemmaForBlockDiffusion.forward: tied lm_head (bf16 out), fp32 soft-capping
  at::Tensor logits = pass.runner().linear(h, weights_.embed, OpSite{OpFamily::LmHead, -1});
  logits = pass.softcap(logits, t.final_logit_softcapping);
  pass.record(Tap::Logits, probe::kNoLayer, logits);
  return logits;
}

}  // namespace batchlens::model
