// SPDX-License-Identifier: Apache-2.0
#include "core/compat/torch_compat.h"

#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#if defined(BL_WITH_CUDA)
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif
#if BL_TORCH_HAS_GROUPED_MM
#include <ATen/ops/_grouped_mm.h>
#endif

#include "core/base/error.h"

namespace batchlens::compat {

SdpaBackend sdpa_backend() {
  return BL_TORCH_HAS_SDPA ? SdpaBackend::Native : SdpaBackend::Math;
}

at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) {
    return x;
  }
  const auto b = x.size(0);
  const auto h = x.size(1);
  const auto s = x.size(2);
  const auto d = x.size(3);
  // [B, Hkv, S, D] -> [B, Hkv, n_rep, S, D] -> [B, Hkv * n_rep, S, D]
  return x.unsqueeze(2).expand({b, h, n_rep, s, d}).reshape({b, h * n_rep, s, d});
}

namespace {

int64_t gqa_groups(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool enable_gqa) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "sdpa expects 4-d q, k, v, got ",
              q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK(k.size(1) == v.size(1) && k.size(2) == v.size(2),
              "sdpa: k and v disagree: ", k.sizes(), " vs ", v.sizes());
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "sdpa: ", q.size(1),
              " query heads are not a multiple of ", k.size(1), " kv heads");
  TORCH_CHECK(enable_gqa || q.size(1) == k.size(1), "sdpa: ", q.size(1), " query heads vs ",
              k.size(1), " kv heads needs enable_gqa");
  return q.size(1) / k.size(1);
}

}  // namespace

at::Tensor sdpa_math(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& mask, double scale, bool is_causal, bool enable_gqa) {
  const int64_t groups = gqa_groups(q, k, v, enable_gqa);
  TORCH_CHECK(!(is_causal && mask.defined()), "sdpa: is_causal with an explicit mask");
  // PyTorch's math backend computes half/bf16 attention in fp32 and casts back.
  // ref: aten/src/ATen/native/transformers/attention.cpp _scaled_dot_product_attention_math
  const bool low = q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf;
  const at::Tensor qf = low ? q.to(at::kFloat) : q;                     // [B, Hq, Sq, D]
  const at::Tensor kf = repeat_kv(low ? k.to(at::kFloat) : k, groups);  // [B, Hq, Sk, D]
  const at::Tensor vf = repeat_kv(low ? v.to(at::kFloat) : v, groups);  // [B, Hq, Sk, Dv]
  // The math backend scales q and k by sqrt(scale) each, for range.
  const double root = std::sqrt(scale);
  at::Tensor scores = at::matmul(qf * root, (kf * root).transpose(-2, -1));  // [B, Hq, Sq, Sk]
  at::Tensor m = mask;
  if (is_causal) {
    m = at::ones({q.size(2), k.size(2)}, q.options().dtype(at::kBool)).tril();
  }
  if (m.defined()) {
    if (m.scalar_type() == at::kBool) {
      scores = scores.masked_fill(m.logical_not(), -std::numeric_limits<float>::infinity());
    } else {
      scores = scores + m.to(scores.scalar_type());
    }
  }
  at::Tensor probs = at::softmax(scores, -1);
  if (m.defined()) {
    // A query that may attend to no key (a padding token's, whose keys are all padding) gets
    // zeros, not NaN: LibTorch 2.5+'s math backend (_safe_softmax). Its output then stays
    // finite, and so do the keys and values later layers make from it.
    const at::Tensor none = (scores == -std::numeric_limits<float>::infinity()).all(-1, true);
    probs = probs.masked_fill(none, 0.0);
  }
  return at::matmul(probs, vf).to(q.scalar_type());  // [B, Hq, Sq, Dv]
}

at::Tensor sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& mask, double scale, bool is_causal, bool enable_gqa) {
#if BL_TORCH_HAS_SDPA
  const int64_t groups = gqa_groups(q, k, v, enable_gqa);
  c10::optional<at::Tensor> m;
  if (mask.defined()) {
    m = mask;
  }
#if BL_TORCH_HAS_SDPA_GQA
  (void)groups;
  return at::scaled_dot_product_attention(q, k, v, m, 0.0, is_causal, scale, enable_gqa);
#else
  return at::scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), m, 0.0,
                                          is_causal, scale);
#endif
#else
  return sdpa_math(q, k, v, mask, scale, is_causal, enable_gqa);
#endif
}

at::Generator make_generator(const at::Device& device, std::uint64_t seed) {
#if defined(BL_WITH_CUDA)
  if (device.is_cuda()) {
    auto gen = at::make_generator<at::CUDAGeneratorImpl>(device.index() < 0 ? 0 : device.index());
    gen.set_current_seed(seed);
    return gen;
  }
#endif
  if (!device.is_cpu()) {
    base::raise(base::ErrorCode::DeviceUnavailable,
                "no random generator for device " + device.str());
  }
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

at::Tensor grouped_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offs) {
#if BL_TORCH_HAS_GROUPED_MM
  // ref: transformers integrations/moe.py _grouped_mm (torch.nn.functional.grouped_mm)
  return at::_grouped_mm(x, w, offs);
#else
  (void)x, (void)w, (void)offs;
  base::raise(base::ErrorCode::InvalidArgument,
              "grouped_mm needs LibTorch 2.8+ (this build: " + torch_version() + ")");
#endif
}

}  // namespace batchlens::compat
