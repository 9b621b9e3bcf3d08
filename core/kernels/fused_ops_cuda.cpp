// SPDX-License-Identifier: Apache-2.0
// Built when LibTorch has CUDA: the tensor side of the fused kernels (fused_kernels.cu).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "core/compat/torch_compat.h"
#include "core/kernels/fused_kernels.h"
#include "core/kernels/fused_ops.h"

namespace batchlens::kernels {
namespace {

cuda::Elem elem_of(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.is_cuda(), "fused ", what, ": not a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), "fused ", what, ": not contiguous");
  if (t.scalar_type() == at::kBFloat16) {
    return cuda::Elem::BF16;
  }
  TORCH_CHECK(t.scalar_type() == at::kFloat, "fused ", what, ": bf16 or fp32 only, got ",
              t.scalar_type());
  return cuda::Elem::F32;
}

void* stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

void check(int code, const char* what) {
  TORCH_CHECK(code == 0, "fused ", what, ": CUDA error ",
              cudaGetErrorString(static_cast<cudaError_t>(code)));
}

// `t` as an argument of x's element type and shape [count] (or one element); null if undefined.
const void* same_type(const at::Tensor& t, const at::Tensor& x, std::int64_t count,
                      const char* what) {
  if (!t.defined()) {
    return nullptr;
  }
  TORCH_CHECK(t.scalar_type() == x.scalar_type(), "fused ", what, ": dtype ", t.scalar_type(),
              " differs from the input's ", x.scalar_type());
  TORCH_CHECK(t.device() == x.device() && t.is_contiguous() && t.numel() == count, "fused ", what,
              ": expected ", count, " contiguous elements on ", x.device());
  return t.data_ptr();
}

}  // namespace

bool built() {
  return true;
}

at::Tensor square(const at::Tensor& x) {
  const cuda::Elem elem = elem_of(x, "square");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(at::kFloat));
  check(cuda::square(elem, x.data_ptr(), out.data_ptr<float>(), x.numel(), stream_of(x)), "square");
  return out;
}

at::Tensor mean_sq(const at::Tensor& x, cuda::MeanOrder order) {
  const cuda::Elem elem = elem_of(x, "mean_sq");
  const std::int64_t n = x.dim() > 0 ? x.size(-1) : 1;
  const std::int64_t rows = n > 0 ? x.numel() / n : 0;
  TORCH_CHECK(mean_sq_fits(rows, n), "fused mean_sq: ", rows, " rows of ", n,
              " are not reduced by ATen in the layout this kernel reproduces");
  const c10::cuda::CUDAGuard guard(x.device());
  std::vector<std::int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = 1;
  at::Tensor out = at::empty(shape, x.options().dtype(at::kFloat));  // [..., 1] fp32
  check(cuda::mean_sq(elem, x.data_ptr(), out.data_ptr<float>(), rows, n, order, stream_of(x)),
        "mean_sq");
  return out;
}

NormResult norm_apply(const NormApply& a) {
  const at::Tensor& x = a.x;
  cuda::NormArgs k;
  k.elem = elem_of(x, "norm");
  const c10::cuda::CUDAGuard guard(x.device());
  k.n = x.dim() > 0 ? x.size(-1) : 1;
  k.rows = k.n > 0 ? x.numel() / k.n : 0;
  TORCH_CHECK(!a.want_mean || a.one_pass, "fused norm: want_mean needs one_pass");
  TORCH_CHECK(!a.one_pass || mean_sq_fits(k.rows, k.n), "fused norm: ", k.rows, " rows of ", k.n,
              " are not reduced by ATen in the layout the one-pass kernel reproduces");
  if (a.mean_sq.defined()) {
    TORCH_CHECK(a.mean_sq.scalar_type() == at::kFloat && a.mean_sq.is_contiguous() &&
                    a.mean_sq.numel() == k.rows && a.mean_sq.device() == x.device(),
                "fused norm: mean_sq must be fp32 with one value per row");
    k.mean_sq = a.mean_sq.data_ptr<float>();
  } else {
    TORCH_CHECK(a.one_pass, "fused norm: mean_sq is required unless one_pass");
  }
  k.x = x.data_ptr();
  k.eps = static_cast<float>(a.eps);
  k.weight = same_type(a.weight, x, k.n, "norm weight");
  if (a.rope_cos.defined()) {
    TORCH_CHECK(x.dim() == 4 && k.n % 2 == 0, "fused norm: RoPE needs x [B, S, H, D], even D");
    const std::int64_t seq = x.size(1);
    k.rope_cos = same_type(a.rope_cos, x, seq * k.n, "rope cos");
    k.rope_sin = same_type(a.rope_sin, x, seq * k.n, "rope sin");
    k.rope_heads = x.size(2);
    k.rope_seq = seq;
  }
  k.scale = same_type(a.scale, x, k.n, "norm scale");
  k.scalar = static_cast<float>(a.scalar);
  k.residual = same_type(a.residual, x, x.numel(), "residual");
  k.layer_scalar = same_type(a.layer_scalar, x, 1, "layer scalar");
  NormResult result;
  if (a.into.defined()) {
    TORCH_CHECK(x.dim() == 4 && a.into.dim() == 4 && a.into.size(0) == x.size(0) &&
                    a.into.size(1) == x.size(2) && a.into.size(2) == x.size(1) &&
                    a.into.size(3) == k.n && a.into.stride(3) == 1 &&
                    a.into.scalar_type() == x.scalar_type() && a.into.device() == x.device(),
                "fused norm: `into` must be a [B, H, S, N] view for x [B, S, H, N], its last "
                "dimension contiguous");
    TORCH_CHECK(!a.want_square && !a.want_mean, "fused norm: `into` takes the result only");
    k.rope_heads = x.size(2);
    k.rope_seq = x.size(1);
    k.out_strided = true;
    k.out_stride_b = a.into.stride(0);
    k.out_stride_h = a.into.stride(1);
    k.out_stride_s = a.into.stride(2);
    k.out = a.into.data_ptr();
    result.out = a.into.transpose(1, 2);
  } else {
    result.out = at::empty_like(x);
    k.out = result.out.data_ptr();
  }
  if (a.want_square) {
    result.square = at::empty(x.sizes(), x.options().dtype(at::kFloat));
    k.square = result.square.data_ptr<float>();
  }
  k.vectorized = a.vectorized;
  std::vector<std::int64_t> mean_shape(x.sizes().begin(), x.sizes().end());
  if (!mean_shape.empty()) {
    mean_shape.back() = 1;
  }
  if (a.one_pass && cuda::norm_vec_fits(k)) {
    k.one_pass = true;
    k.mean_order = a.mean_order;
    if (a.want_mean) {
      result.mean = at::empty(mean_shape, x.options().dtype(at::kFloat));  // [..., 1] fp32
      k.mean_out = result.mean.data_ptr<float>();
    }
    check(cuda::norm_apply(k, stream_of(x)), "norm (one pass)");
    return result;
  }
  // Not one pass (or a view off the vector alignment): the mean, the tail and the result's mean
  // apart, each with the same bits.
  at::Tensor ms = a.mean_sq;
  if (!ms.defined()) {
    ms = mean_sq(x, a.mean_order);
    k.mean_sq = ms.data_ptr<float>();
  }
  check(cuda::norm_apply(k, stream_of(x)), "norm");
  if (a.want_mean) {
    result.mean = mean_sq(result.out, a.mean_order);
  }
  return result;
}

at::Tensor moe_combine(const at::Tensor& proj, const at::Tensor& weights, const at::Tensor& perm,
                       int lanes, bool quads) {
  const cuda::Elem elem = elem_of(proj, "combine");
  const c10::cuda::CUDAGuard guard(proj.device());
  TORCH_CHECK(proj.dim() == 2 && weights.dim() == 2 && weights.scalar_type() == at::kFloat &&
                  weights.is_contiguous() && perm.scalar_type() == at::kLong &&
                  perm.is_contiguous() && perm.numel() == proj.size(0) &&
                  weights.numel() == proj.size(0),
              "fused combine: expected proj [T*K, H], weights [T, K] fp32, perm [T*K] int64");
  const std::int64_t tokens = weights.size(0);
  const auto k_count = static_cast<int>(weights.size(1));
  const std::int64_t hidden = proj.size(1);
  at::Tensor inv = at::empty_like(perm);
  void* stream = stream_of(proj);
  check(cuda::inverse_permutation(perm.data_ptr<std::int64_t>(), inv.data_ptr<std::int64_t>(),
                                  perm.numel(), stream),
        "inverse permutation");
  at::Tensor out = at::empty({tokens, hidden}, proj.options());
  check(cuda::moe_combine(elem, proj.data_ptr(), weights.data_ptr<float>(),
                          inv.data_ptr<std::int64_t>(), tokens, k_count, hidden, lanes, quads,
                          out.data_ptr(), stream),
        "combine");
  return out;
}

at::Tensor gelu_mul(const at::Tensor& gate, const at::Tensor& up, bool contract, bool quads) {
  TORCH_CHECK(gate.is_cuda() && gate.dim() == 2 && up.sizes() == gate.sizes() &&
                  gate.scalar_type() == up.scalar_type() && gate.stride(1) == 1 &&
                  up.stride(1) == 1 && gate.stride(0) == up.stride(0) &&
                  gate.device() == up.device(),
              "fused gelu_mul: expected gate and up [R, I] with the same row stride");
  TORCH_CHECK(gate.scalar_type() == at::kBFloat16 || gate.scalar_type() == at::kFloat,
              "fused gelu_mul: bf16 or fp32 only");
  const cuda::Elem elem = gate.scalar_type() == at::kBFloat16 ? cuda::Elem::BF16 : cuda::Elem::F32;
  const c10::cuda::CUDAGuard guard(gate.device());
  at::Tensor out = at::empty(gate.sizes(), gate.options());
  check(cuda::gelu_mul(elem, gate.data_ptr(), up.data_ptr(), gate.stride(0), gate.size(0),
                       gate.size(1), contract, quads, out.data_ptr(), stream_of(gate)),
        "gelu_mul");
  return out;
}

bool route_fits(std::int64_t count, std::int64_t experts) {
  return cuda::route_supported(count, experts);
}

Route route(const at::Tensor& index, std::int64_t experts, std::int64_t rows) {
  TORCH_CHECK(index.is_cuda() && index.dim() == 2 && index.scalar_type() == at::kLong &&
                  index.is_contiguous(),
              "fused route: expected contiguous int64 [T, K] on a CUDA device");
  TORCH_CHECK(route_fits(index.numel(), experts), "fused route: too many ids for one block");
  const std::int64_t tokens = index.size(0);
  TORCH_CHECK(rows <= 0 || (tokens % rows == 0), "fused route: rows must divide T");
  const c10::cuda::CUDAGuard guard(index.device());
  Route r;
  r.perm = at::empty({index.numel()}, index.options());
  r.token_of = at::empty_like(r.perm);
  r.offsets = at::empty({experts}, index.options().dtype(at::kInt));
  if (rows > 0) {
    r.row_of = at::empty_like(r.perm);
  }
  check(cuda::route(index.data_ptr<std::int64_t>(), index.numel(), static_cast<int>(experts),
                    static_cast<int>(index.size(1)), rows > 0 ? tokens / rows : 0,
                    r.perm.data_ptr<std::int64_t>(), r.token_of.data_ptr<std::int64_t>(),
                    r.offsets.data_ptr<std::int32_t>(),
                    rows > 0 ? r.row_of.data_ptr<std::int64_t>() : nullptr, stream_of(index)),
        "route");
  return r;
}

bool router_topk_fits(std::int64_t experts, std::int64_t top_k) {
  return cuda::router_topk_supported(experts, top_k);
}

std::pair<at::Tensor, at::Tensor> router_topk(const at::Tensor& scores,
                                              const at::Tensor& per_expert_scale,
                                              std::int64_t top_k, cuda::MeanOrder order) {
  const cuda::Elem elem = elem_of(scores, "router");
  TORCH_CHECK(scores.dim() == 2 && router_topk_fits(scores.size(1), top_k),
              "fused router: expected scores [T, E] with E <= 1024 and 1 <= k <= min(E, 32)");
  const std::int64_t rows = scores.size(0);
  const std::int64_t experts = scores.size(1);
  const void* scale = same_type(per_expert_scale, scores, experts, "router");
  TORCH_CHECK(scale != nullptr, "fused router: per_expert_scale is undefined");
  const c10::cuda::CUDAGuard guard(scores.device());
  at::Tensor weights = at::empty({rows, top_k}, scores.options().dtype(at::kFloat));
  at::Tensor index = at::empty({rows, top_k}, scores.options().dtype(at::kLong));
  check(cuda::router_topk(elem, scores.data_ptr(), rows, experts, top_k, scale, order,
                          weights.data_ptr<float>(), index.data_ptr<std::int64_t>(),
                          stream_of(scores)),
        "router");
  return {weights, index};
}

bool expert_gemm_fits(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offs,
                      std::int64_t max_rows) {
  if (!x.is_cuda() || x.dim() != 2 || w.dim() != 3 || offs.dim() != 1 ||
      x.scalar_type() != at::kBFloat16 || w.scalar_type() != at::kBFloat16 ||
      offs.scalar_type() != at::kInt || w.device() != x.device() || offs.device() != x.device() ||
      !x.is_contiguous() || !offs.is_contiguous()) {
    return false;
  }
  const std::int64_t experts = w.size(0);
  const std::int64_t k = w.size(1);
  const std::int64_t n = w.size(2);
  // w [E, K, N] must be the transpose of a contiguous [E, N, K]; both read 16 bytes at a time.
  const auto aligned = [](const at::Tensor& t) {
    return reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0;
  };
  const bool layout =
      w.stride(1) == 1 && w.stride(2) == k && w.stride(0) == n * k && aligned(x) && aligned(w);
  return layout && x.size(1) == k && offs.size(0) == experts &&
         x.size(0) <= std::min(max_rows, kExpertGemmRows) * experts &&
         cuda::expert_gemm_supported(x.size(0), experts, n, k);
}

at::Tensor expert_gemm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offs,
                       cuda::ExpertFold fold) {
  TORCH_CHECK(expert_gemm_fits(x, w, offs),
              "fused expert GEMM: expected x [R, K] bf16, w [E, K, N] bf16 (the transpose of a "
              "contiguous [E, N, K], N a multiple of 128, K of 64), offs [E] int32");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty({x.size(0), w.size(2)}, x.options());
  check(cuda::expert_gemm(x.data_ptr(), w.data_ptr(), offs.data_ptr<std::int32_t>(), x.size(0),
                          w.size(0), w.size(2), w.size(1), fold, out.data_ptr(), stream_of(x)),
        "expert GEMM");
  return out;
}

at::Tensor device_normal(at::IntArrayRef shape, double scale, std::uint64_t seed,
                         const at::Device& device, at::ScalarType dtype) {
  TORCH_CHECK(device.is_cuda(), "device_normal: not a CUDA device: ", device.str());
  const c10::cuda::CUDAGuard guard(device);
  at::Generator gen = at::cuda::detail::createCUDAGenerator(device.index());
  gen.set_current_seed(seed);
  return at::randn(shape, gen, at::TensorOptions().device(device).dtype(at::kFloat))
      .mul_(scale)
      .to(dtype);
}

std::pair<double, double> time_expert_gemm(const at::Tensor& x, const at::Tensor& w,
                                           const at::Tensor& offs, cuda::ExpertFold fold) {
  const c10::cuda::CUDAGuard guard(x.device());
  auto* s = static_cast<cudaStream_t>(stream_of(x));
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  check(static_cast<int>(cudaEventCreate(&start)), "expert GEMM timing");
  check(static_cast<int>(cudaEventCreate(&stop)), "expert GEMM timing");
  const auto median_ms = [&](const std::function<void()>& run) {
    run();
    std::vector<float> ms;
    for (int i = 0; i < 5; ++i) {
      float t = 0.0F;
      cudaEventRecord(start, s);
      run();
      cudaEventRecord(stop, s);
      cudaEventSynchronize(stop);
      cudaEventElapsedTime(&t, start, stop);
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return static_cast<double>(ms[ms.size() / 2]);
  };
  const double own = median_ms([&] { (void)expert_gemm(x, w, offs, fold); });
  const double torch = median_ms([&] { (void)compat::grouped_mm(x, w, offs); });
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return {own, torch};
}

at::Tensor softcap(const at::Tensor& logits, double cap, bool quads) {
  const cuda::Elem elem = elem_of(logits, "softcap");
  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor out = at::empty(logits.sizes(), logits.options().dtype(at::kFloat));
  // ATen: opmath_t(1.0) / scalar_value<opmath_t>() on the host, in fp32.
  const float cap_f = static_cast<float>(cap);
  const float inv = 1.0F / cap_f;
  check(cuda::softcap(elem, logits.data_ptr(), inv, cap_f, out.data_ptr<float>(), logits.numel(),
                      quads, stream_of(logits)),
        "softcap");
  return out;
}

bool softmax_probs_fit(std::int64_t n) {
  return cuda::softmax_bf16_fits(n);
}

at::Tensor softmax_probs(const at::Tensor& x, cuda::MeanOrder order, int threads) {
  TORCH_CHECK(
      elem_of(x, "softmax") == cuda::Elem::BF16 && x.dim() >= 1 && softmax_probs_fit(x.size(-1)),
      "fused softmax: expected bf16 [..., n] with n > 1024 and a multiple of 4");
  const c10::cuda::CUDAGuard guard(x.device());
  // The kernel reads four elements at once: a view off that alignment is read from a copy.
  const at::Tensor in = cuda::aligned4(x.data_ptr(), x.element_size()) ? x : x.clone();
  at::Tensor out = at::empty_like(in, at::MemoryFormat::Contiguous);
  const std::int64_t n = in.size(-1);
  check(cuda::softmax_bf16(in.data_ptr(), in.numel() / n, n, order, threads, out.data_ptr(),
                           stream_of(in)),
        "softmax");
  return out;
}

at::Tensor position_diffs(const std::vector<cuda::DiffPair>& pairs, std::int64_t positions,
                          const at::Device& device) {
  TORCH_CHECK(device.is_cuda(), "position_diffs: not a CUDA device: ", device.str());
  const c10::cuda::CUDAGuard guard(device);
  const auto count = static_cast<std::int64_t>(pairs.size());
  at::Tensor out =
      at::empty({count, 3, positions}, at::TensorOptions().dtype(at::kFloat).device(device));
  if (count == 0) {
    return out;
  }
  // The descriptors travel as kernel parameters: no device buffer, no copy, no host sync.
  check(cuda::position_diff(pairs.data(), count, positions, out.data_ptr<float>(),
                            c10::cuda::getCurrentCUDAStream(device.index()).stream()),
        "position_diff");
  return out;
}

}  // namespace batchlens::kernels
