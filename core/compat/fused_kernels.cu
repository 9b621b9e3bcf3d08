// SPDX-License-Identifier: Apache-2.0
// Fused elementwise kernels of the decoder layer (fused_kernels.h says what each computes).
// Bitwise rules, so that each kernel equals the ATen op chain it replaces:
// - every fp32 multiply and add is an explicit __fmul_rn / __fadd_rn (no contraction into FMA:
//   ATen runs each op as its own kernel and rounds after each);
// - a value ATen stores as bf16 between two ops is rounded here too (round_to), with
//   __float2bfloat16_rn, which is what c10::BFloat16's conversion compiles to on CUDA;
// - rsqrtf and tanhf are the CUDA math library's, as in ATen's rsqrt and gelu kernels.
// core/compat/fused_ops_cuda.cpp checks every kernel against ATen on the device before use.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/compat/fused_kernels.h"

namespace batchlens::compat::fused::kernels {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float load(const float* p, std::int64_t i) {
  return p[i];
}
__device__ __forceinline__ float load(const __nv_bfloat16* p, std::int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void store(float* p, std::int64_t i, float v) {
  p[i] = v;
}
__device__ __forceinline__ void store(__nv_bfloat16* p, std::int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}
// The value a T tensor holds after storing v.
__device__ __forceinline__ float round_to(const float* /*tag*/, float v) {
  return v;
}
__device__ __forceinline__ float round_to(const __nv_bfloat16* /*tag*/, float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

std::int64_t blocks_for(std::int64_t count) {
  const std::int64_t b = (count + kThreads - 1) / kThreads;
  return b < 1 ? 1 : (b > 65535LL * 32 ? 65535LL * 32 : b);
}

template <typename T>
__global__ void square_kernel(const T* x, float* out, std::int64_t count) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float v = load(x, i);
    out[i] = __fmul_rn(v, v);  // ref: x.float().pow(2) (pow with exponent 2 is base * base)
  }
}

template <typename T>
struct Norm {
  const T* x;
  const float* mean_sq;
  float eps;
  std::int64_t rows, n;
  const T* weight;
  const T* cos;
  const T* sin;
  std::int64_t heads, seq;
  const T* scale;
  float scalar;
  const T* residual;
  const T* layer_scalar;
  T* out;
  float* square;
};

// ref: DiffusionGemmaRMSNorm.forward: (x.float() * pow(mean_sq, -0.5)) * weight.float(),
// .type_as(x). pow(t, -0.5) is ATen's rsqrt kernel; mean_sq already holds mean + eps.
template <typename T>
__device__ __forceinline__ float normed(const Norm<T>& a, std::int64_t row, std::int64_t d,
                                        float r) {
  float y = __fmul_rn(load(a.x, row * a.n + d), r);
  if (a.weight != nullptr) {
    y = __fmul_rn(y, load(a.weight, d));
  }
  return round_to(a.x, y);
}

template <typename T>
__global__ void norm_kernel(Norm<T> a) {
  const std::int64_t count = a.rows * a.n;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t row = i / a.n;
    const std::int64_t d = i - row * a.n;
    const float r = rsqrtf(__fadd_rn(a.mean_sq[row], a.eps));
    float v = normed(a, row, d, r);
    if (a.cos != nullptr) {
      // ref: apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, each op in T.
      const std::int64_t half = a.n / 2;
      const float partner = normed(a, row, d < half ? d + half : d - half, r);
      const float rotated = d < half ? -partner : partner;
      const std::int64_t s = (row / a.heads) % a.seq;
      const float xc = round_to(a.x, __fmul_rn(v, load(a.cos, s * a.n + d)));
      const float rs = round_to(a.x, __fmul_rn(rotated, load(a.sin, s * a.n + d)));
      v = round_to(a.x, __fadd_rn(xc, rs));
    }
    if (a.scale != nullptr) {
      // ref: DiffusionGemmaTextRouter.forward: normed * self.scale * self.scalar_root_size
      v = round_to(a.x, __fmul_rn(v, load(a.scale, d)));
      v = round_to(a.x, __fmul_rn(v, a.scalar));
    }
    if (a.residual != nullptr) {
      v = round_to(a.x, __fadd_rn(load(a.residual, i), v));  // residual + h
    }
    if (a.layer_scalar != nullptr) {
      v = round_to(a.x, __fmul_rn(v, load(a.layer_scalar, 0)));  // h *= layer_scalar
    }
    store(a.out, i, v);
    if (a.square != nullptr) {
      a.square[i] = __fmul_rn(v, v);
    }
  }
}

__global__ void inverse_kernel(const std::int64_t* perm, std::int64_t* inv, std::int64_t count) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    inv[perm[i]] = i;
  }
}

constexpr int kMaxTopK = 64;
constexpr int kAccumulators = 4;  // ATen's vt0: independent accumulators per thread

// ref: grouped_mm_experts_forward: (proj * sample_weights_g)[inv_perm].view(T, K, H).sum(1)
// .to(dtype). The sum follows ATen's reduce kernel for a reduction over a non-innermost
// dimension: `lanes` threads along k, thread y takes k = y, y + lanes, ... into four
// accumulators (each starting at 0), combines them in order, then the lanes combine as a tree
// (halving offsets), as block_y_reduce does.
template <typename T>
__global__ void combine_kernel(const T* proj, const float* weights, const std::int64_t* inv,
                               std::int64_t tokens, int k_count, std::int64_t hidden, int lanes,
                               T* out) {
  const std::int64_t count = tokens * hidden;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t t = i / hidden;
    const std::int64_t h = i - t * hidden;
    float lane_value[32];
    for (int y = 0; y < lanes; ++y) {
      float acc[kAccumulators] = {0.0F, 0.0F, 0.0F, 0.0F};
      int idx = y;
      while (idx + (kAccumulators - 1) * lanes < k_count) {
        for (int j = 0; j < kAccumulators; ++j) {
          const std::int64_t flat = t * k_count + idx + j * lanes;
          const std::int64_t src = inv[flat];
          acc[j] = __fadd_rn(acc[j], __fmul_rn(load(proj, src * hidden + h), weights[flat]));
        }
        idx += kAccumulators * lanes;
      }
      for (int j = 0; j < kAccumulators && idx < k_count; ++j) {
        const std::int64_t flat = t * k_count + idx;
        const std::int64_t src = inv[flat];
        acc[j] = __fadd_rn(acc[j], __fmul_rn(load(proj, src * hidden + h), weights[flat]));
        idx += lanes;
      }
      float v = acc[0];
      for (int j = 1; j < kAccumulators; ++j) {
        v = __fadd_rn(v, acc[j]);
      }
      lane_value[y] = v;
    }
    for (int offset = lanes / 2; offset > 0; offset /= 2) {
      for (int y = 0; y < offset; ++y) {
        lane_value[y] = __fadd_rn(lane_value[y], lane_value[y + offset]);
      }
    }
    store(out, i, lane_value[0]);
  }
}

// ref: DiffusionGemmaText4MLP.forward / _default_apply_gate: act_fn(gate) * up, with ATen's
// GeluCUDAKernelImpl (tanh): 0.5 * x * (1 + tanh(kBeta * (x + kKappa * x^3))) in fp32.
template <typename T>
__global__ void gelu_mul_kernel(const T* gate, const T* up, std::int64_t stride, std::int64_t rows,
                                std::int64_t inter, bool contract, T* out) {
  constexpr float kBeta = static_cast<float>(1.4142135623730951 * 1.1283791670955126 * 0.5);
  constexpr float kKappa = 0.044715F;
  const std::int64_t count = rows * inter;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / inter;
    const std::int64_t j = i - r * inter;
    const float x = load(gate, r * stride + j);
    const float cube = __fmul_rn(__fmul_rn(x, x), x);
    const float sum = contract ? __fmaf_rn(kKappa, cube, x) : __fadd_rn(x, __fmul_rn(kKappa, cube));
    const float inner = __fmul_rn(kBeta, sum);
    const float g = round_to(gate, __fmul_rn(__fmul_rn(0.5F, x), __fadd_rn(1.0F, tanhf(inner))));
    store(out, i, __fmul_rn(g, load(up, r * stride + j)));
  }
}

// ref: DiffusionGemmaForBlockDiffusion.forward: logits.float() / cap, tanh, * cap (ATen divides
// by a CPU scalar as a multiplication by its fp32 reciprocal).
template <typename T>
__global__ void softcap_kernel(const T* x, float inv_cap, float cap, float* out,
                               std::int64_t count) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __fmul_rn(tanhf(__fmul_rn(load(x, i), inv_cap)), cap);
  }
}

int status() {
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int square(Elem elem, const void* x, float* out, std::int64_t count, void* stream) {
  auto* s = static_cast<cudaStream_t>(stream);
  if (elem == Elem::BF16) {
    square_kernel<<<blocks_for(count), kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(x), out,
                                                         count);
  } else {
    square_kernel<<<blocks_for(count), kThreads, 0, s>>>(static_cast<const float*>(x), out, count);
  }
  return status();
}

namespace {
template <typename T>
Norm<T> typed(const NormArgs& a) {
  return Norm<T>{static_cast<const T*>(a.x),
                 a.mean_sq,
                 a.eps,
                 a.rows,
                 a.n,
                 static_cast<const T*>(a.weight),
                 static_cast<const T*>(a.rope_cos),
                 static_cast<const T*>(a.rope_sin),
                 a.rope_heads,
                 a.rope_seq,
                 static_cast<const T*>(a.scale),
                 a.scalar,
                 static_cast<const T*>(a.residual),
                 static_cast<const T*>(a.layer_scalar),
                 static_cast<T*>(a.out),
                 a.square};
}
}  // namespace

int norm_apply(const NormArgs& args, void* stream) {
  auto* s = static_cast<cudaStream_t>(stream);
  const std::int64_t count = args.rows * args.n;
  if (args.elem == Elem::BF16) {
    norm_kernel<<<blocks_for(count), kThreads, 0, s>>>(typed<__nv_bfloat16>(args));
  } else {
    norm_kernel<<<blocks_for(count), kThreads, 0, s>>>(typed<float>(args));
  }
  return status();
}

int inverse_permutation(const std::int64_t* perm, std::int64_t* inv, std::int64_t count,
                        void* stream) {
  inverse_kernel<<<blocks_for(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(perm, inv,
                                                                                        count);
  return status();
}

int moe_combine(Elem elem, const void* proj, const float* weights, const std::int64_t* inv,
                std::int64_t tokens, int k_count, std::int64_t hidden, int lanes, void* out,
                void* stream) {
  if (k_count < 1 || k_count > kMaxTopK || lanes < 1 || lanes > 32 || (lanes & (lanes - 1)) != 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  auto* s = static_cast<cudaStream_t>(stream);
  const std::int64_t count = tokens * hidden;
  if (elem == Elem::BF16) {
    combine_kernel<<<blocks_for(count), kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(proj),
                                                          weights, inv, tokens, k_count, hidden,
                                                          lanes, static_cast<__nv_bfloat16*>(out));
  } else {
    combine_kernel<<<blocks_for(count), kThreads, 0, s>>>(static_cast<const float*>(proj), weights,
                                                          inv, tokens, k_count, hidden, lanes,
                                                          static_cast<float*>(out));
  }
  return status();
}

int gelu_mul(Elem elem, const void* gate, const void* up, std::int64_t stride, std::int64_t rows,
             std::int64_t inter, bool contract, void* out, void* stream) {
  auto* s = static_cast<cudaStream_t>(stream);
  const std::int64_t count = rows * inter;
  if (elem == Elem::BF16) {
    gelu_mul_kernel<<<blocks_for(count), kThreads, 0, s>>>(
        static_cast<const __nv_bfloat16*>(gate), static_cast<const __nv_bfloat16*>(up), stride,
        rows, inter, contract, static_cast<__nv_bfloat16*>(out));
  } else {
    gelu_mul_kernel<<<blocks_for(count), kThreads, 0, s>>>(
        static_cast<const float*>(gate), static_cast<const float*>(up), stride, rows, inter,
        contract, static_cast<float*>(out));
  }
  return status();
}

int softcap(Elem elem, const void* x, float inv_cap, float cap, float* out, std::int64_t count,
            void* stream) {
  auto* s = static_cast<cudaStream_t>(stream);
  if (elem == Elem::BF16) {
    softcap_kernel<<<blocks_for(count), kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(x),
                                                          inv_cap, cap, out, count);
  } else {
    softcap_kernel<<<blocks_for(count), kThreads, 0, s>>>(static_cast<const float*>(x), inv_cap,
                                                          cap, out, count);
  }
  return status();
}

}  // namespace batchlens::compat::fused::kernels
