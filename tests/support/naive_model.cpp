// SPDX-License-Identifier: Apache-2.0
#include "tests/support/naive_model.h"

#include <cmath>
#include <vector>

#include <ATen/ATen.h>

namespace batchlens::testing {

namespace {

using at::Tensor;

Tensor d(const Tensor& t) {
  return t.to(at::kDouble);
}

Tensor rms(const Tensor& x, const Tensor& w, double eps) {
  Tensor y = x / at::sqrt((x * x).mean(-1, true) + eps);
  return w.defined() ? y * d(w) : y;
}

Tensor gelu_tanh(const Tensor& x) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + at::tanh(c * (x + 0.044715 * x * x * x)));
}

// Rotates pairs (i, i + D/2) of x [S, D] by angle pos[p] * inv_freq[i].
Tensor rope(const Tensor& x, const std::vector<double>& inv_freq,
            const std::vector<std::int64_t>& pos) {
  Tensor out = x.clone();
  const std::int64_t s = x.size(0);
  const std::int64_t half = x.size(1) / 2;
  for (std::int64_t p = 0; p < s; ++p) {
    for (std::int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(pos[static_cast<std::size_t>(p)]) *
                       inv_freq[static_cast<std::size_t>(i)];
      const double x1 = x[p][i].item<double>();
      const double x2 = x[p][i + half].item<double>();
      out[p][i] = x1 * std::cos(a) - x2 * std::sin(a);
      out[p][i + half] = x2 * std::cos(a) + x1 * std::sin(a);
    }
  }
  return out;
}

std::vector<double> inv_freq(const model::RopeParams& r, std::int64_t head_dim) {
  std::vector<double> f(static_cast<std::size_t>(head_dim / 2), 0.0);
  if (r.rope_type == "proportional") {
    const auto angles = static_cast<std::int64_t>(r.partial_rotary_factor * head_dim / 2.0);
    for (std::int64_t i = 0; i < angles; ++i) {
      f[static_cast<std::size_t>(i)] =
          std::pow(r.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim)) /
          r.factor;
    }
  } else {
    for (std::int64_t i = 0; i < head_dim / 2; ++i) {
      f[static_cast<std::size_t>(i)] =
          std::pow(r.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    }
  }
  return f;
}

struct LayerKv {
  Tensor k;  // [Hkv, L, D]
  Tensor v;
};

// One layer over x [S, H] of one row, whose tokens fill slots first_slot .. first_slot + S - 1
// at position ids `pos`; `real[slot]` says which slots (all so far, these included) are not
// padding. Encoder: causal (+window) over slots, appends to kv. Decoder: sees kv (already
// truncated) + itself. Both never attend to a padding slot; a query with nothing to attend to
// gets zeros.
Tensor layer(const model::ModelConfig& cfg, const model::LayerWeights& w, int l, const Tensor& x,
             const std::vector<std::int64_t>& pos, std::int64_t first_slot,
             const std::vector<bool>& real, LayerKv& kv, bool encoder) {
  const auto& t = cfg.text;
  const double eps = t.rms_norm_eps;
  const std::int64_t s = x.size(0);
  const std::int64_t dh = t.layer_head_dim(l);
  const std::int64_t hq = t.num_attention_heads;
  const std::int64_t hkv = t.layer_kv_heads(l);
  const bool sliding = t.is_sliding(l);
  const auto freqs = inv_freq(sliding ? t.rope_sliding : t.rope_full, dh);

  const Tensor h = rms(x, w.input_layernorm, eps);
  const Tensor q_all = at::matmul(h, d(w.q_proj).t()).view({s, hq, dh});
  const Tensor k_all = at::matmul(h, d(w.k_proj).t()).view({s, hkv, dh});
  const Tensor v_all =
      w.v_proj.defined() ? at::matmul(h, d(w.v_proj).t()).view({s, hkv, dh}) : k_all;
  std::vector<Tensor> k_new;
  std::vector<Tensor> v_new;
  for (std::int64_t j = 0; j < hkv; ++j) {
    k_new.push_back(rope(rms(k_all.select(1, j), w.k_norm, eps), freqs, pos));
    v_new.push_back(rms(v_all.select(1, j), Tensor(), eps));
  }
  const Tensor k_cur = at::stack(k_new);  // [Hkv, S, D]
  const Tensor v_cur = at::stack(v_new);
  const std::int64_t past = kv.k.defined() ? kv.k.size(1) : 0;
  const Tensor keys = past > 0 ? at::cat({kv.k, k_cur}, 1) : k_cur;
  const Tensor values = past > 0 ? at::cat({kv.v, v_cur}, 1) : v_cur;
  const std::int64_t kv_len = keys.size(1);

  Tensor attn = at::zeros({s, hq * dh}, x.options());
  for (std::int64_t i = 0; i < hq; ++i) {
    const std::int64_t j = i / (hq / hkv);
    const Tensor q = rope(rms(q_all.select(1, i), w.q_norm, eps), freqs, pos);  // [S, D]
    Tensor scores = at::matmul(q, keys[j].t());                                 // scale 1.0
    for (std::int64_t a = 0; a < s; ++a) {
      const std::int64_t qslot = first_slot + a;
      bool any = false;
      for (std::int64_t b = 0; b < kv_len; ++b) {
        const std::int64_t kslot = first_slot + s - kv_len + b;
        bool ok = real[static_cast<std::size_t>(kslot)];
        if (encoder) {
          ok = ok && kslot <= qslot && (!sliding || kslot > qslot - t.sliding_window);
        }
        if (!ok) {
          scores[a][b] = -INFINITY;
        }
        any = any || ok;
      }
      const Tensor out =
          any ? at::matmul(at::softmax(scores[a], -1), values[j]) : at::zeros({dh}, x.options());
      attn[a].narrow(0, i * dh, dh).copy_(out);
    }
  }
  Tensor y = x + rms(at::matmul(attn, d(w.o_proj).t()), w.post_attention_layernorm, eps);

  if (encoder) {
    // HF keeps all positions on full layers, the last window - 1 on sliding layers.
    const std::int64_t keep =
        sliding ? std::min<std::int64_t>(kv_len, t.sliding_window - 1) : kv_len;
    kv.k = keys.narrow(1, kv_len - keep, keep);
    kv.v = values.narrow(1, kv_len - keep, keep);
  }

  // Dense branch.
  const Tensor hd = rms(y, w.pre_feedforward_layernorm, eps);
  const Tensor dense =
      at::matmul(gelu_tanh(at::matmul(hd, d(w.mlp_gate).t())) * at::matmul(hd, d(w.mlp_up).t()),
                 d(w.mlp_down).t());
  const Tensor h1 = rms(dense, w.post_feedforward_layernorm_1, eps);
  // MoE branch: routed on the raw residual y.
  const Tensor r = rms(y, Tensor(), eps) * d(w.router_scale) / std::sqrt(double(t.hidden_size));
  const Tensor probs = at::softmax(at::matmul(r, d(w.router_proj).t()), -1);  // [S, E]
  const Tensor xe = rms(y, w.pre_feedforward_layernorm_2, eps);
  Tensor moe = at::zeros_like(y);
  const std::int64_t im = t.moe_intermediate_size;
  for (std::int64_t p = 0; p < s; ++p) {
    const auto top = at::topk(probs[p], t.top_k_experts);
    const Tensor wk = std::get<0>(top) / std::get<0>(top).sum();
    for (std::int64_t k = 0; k < t.top_k_experts; ++k) {
      const std::int64_t e = std::get<1>(top)[k].item<std::int64_t>();
      const Tensor gu = at::matmul(d(w.experts_gate_up[e]), xe[p]);  // [2 Im]
      const Tensor act = gelu_tanh(gu.narrow(0, 0, im)) * gu.narrow(0, im, im);
      const double weight = wk[k].item<double>() * d(w.router_per_expert_scale)[e].item<double>();
      moe[p] += at::matmul(d(w.experts_down[e]), act) * weight;
    }
  }
  const Tensor h2 = rms(moe, w.post_feedforward_layernorm_2, eps);
  Tensor out = y + rms(h1 + h2, w.post_feedforward_layernorm, eps);
  return out * d(encoder ? w.encoder_layer_scalar : w.layer_scalar);
}

}  // namespace

at::Tensor naive_forward(const model::ModelConfig& config, const model::ModelWeights& weights,
                         const at::Tensor& prompt, const at::Tensor& canvas,
                         const at::Tensor& sc_logits) {
  const std::int64_t b = prompt.size(0);
  const std::int64_t l = prompt.size(1);
  const std::int64_t c = canvas.size(1);
  const auto lopt = at::TensorOptions().dtype(at::kLong);
  return naive_forward_padded(config, weights, prompt, at::ones({b, l}, at::kBool),
                              at::arange(l, lopt).expand({b, l}), canvas,
                              at::arange(l, l + c, lopt).expand({b, c}), sc_logits);
}

at::Tensor naive_forward_padded(const model::ModelConfig& config,
                                const model::ModelWeights& weights, const at::Tensor& prompt,
                                const at::Tensor& valid, const at::Tensor& prompt_positions,
                                const at::Tensor& canvas, const at::Tensor& canvas_positions,
                                const at::Tensor& sc_logits) {
  const auto to_vec = [](const Tensor& row) {
    const Tensor r = row.to(at::kLong).contiguous();
    return std::vector<std::int64_t>(r.data_ptr<std::int64_t>(),
                                     r.data_ptr<std::int64_t>() + r.numel());
  };
  const auto& t = config.text;
  const double eps = t.rms_norm_eps;
  const Tensor embed = d(weights.embed);
  // The embedding scale is sqrt(H) rounded to the weight dtype.
  const double scale = at::scalar_tensor(std::sqrt(double(t.hidden_size)), at::kFloat)
                           .to(weights.embed.scalar_type())
                           .item<double>();
  std::vector<Tensor> rows;
  for (std::int64_t b = 0; b < canvas.size(0); ++b) {
    std::vector<LayerKv> kv(static_cast<std::size_t>(t.num_hidden_layers));
    std::vector<bool> real;
    for (const std::int64_t v : to_vec(valid[b])) {
      real.push_back(v != 0);
    }
    const std::vector<std::int64_t> prompt_pos = to_vec(prompt_positions[b]);
    Tensor x = embed.index({prompt[b]}) * scale;
    for (int l = 0; l < t.num_hidden_layers; ++l) {
      x = layer(config, weights.layers[static_cast<std::size_t>(l)], l, x, prompt_pos, 0, real,
                kv[static_cast<std::size_t>(l)], true);
    }
    const std::int64_t first = prompt.size(1);
    real.resize(real.size() + static_cast<std::size_t>(canvas.size(1)), true);
    const std::vector<std::int64_t> canvas_pos = to_vec(canvas_positions[b]);
    const Tensor e = embed.index({canvas[b]}) * scale;
    Tensor soft = at::zeros_like(e);
    if (sc_logits.defined()) {
      soft = at::matmul(at::softmax(d(sc_logits[b]), -1), embed) * scale;
    }
    const Tensor n = rms(soft, weights.sc_pre_norm, eps);
    const Tensor sc = at::matmul(
        gelu_tanh(at::matmul(n, d(weights.sc_gate).t())) * at::matmul(n, d(weights.sc_up).t()),
        d(weights.sc_down).t());
    x = rms(e + sc, Tensor(), eps);
    for (int l = 0; l < t.num_hidden_layers; ++l) {
      x = layer(config, weights.layers[static_cast<std::size_t>(l)], l, x, canvas_pos, first, real,
                kv[static_cast<std::size_t>(l)], false);
    }
    const Tensor logits = at::matmul(rms(x, weights.final_norm, eps), embed.t());
    rows.push_back(at::tanh(logits / t.final_logit_softcapping) * t.final_logit_softcapping);
  }
  return at::stack(rows);
}

}  // namespace batchlens::testing
