// SPDX-License-Identifier: Apache-2.0
// Fused elementwise kernels of the decoder layer (fused_kernels.h says what each computes).
// Bitwise rules, so that each kernel equals the ATen op chain it replaces:
// - every fp32 multiply and add is an explicit __fmul_rn / __fadd_rn (no contraction into FMA:
//   ATen runs each op as its own kernel and rounds after each);
// - a value ATen stores as bf16 between two ops is rounded here too (round_to), with
//   __float2bfloat16_rn, which is what c10::BFloat16's conversion compiles to on CUDA;
// - rsqrtf and tanhf are the CUDA math library's, as in ATen's rsqrt and gelu kernels.
// core/kernels/fused_ops_cuda.cpp checks every kernel against ATen on the device before use.
#include <cstddef>
#include <cstdint>

#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "core/kernels/fused_kernels.h"

namespace batchlens::kernels::cuda {
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

// Four consecutive elements in one access (8 bytes of bf16, 16 of fp32): the vectorised tail
// and the mean of squares. bf16 travels as raw bits in a uint2 (a struct of two
// __nv_bfloat162 is copied member by member, two 4-byte accesses); element 0 is the low half
// (little-endian), and bf16 -> fp32 is exact: the bf16 bits are the fp32's upper 16.
__device__ __forceinline__ float bf16_bits_to_float(short b) {
  return __uint_as_float(static_cast<unsigned>(static_cast<unsigned short>(b)) << 16);
}
__device__ __forceinline__ unsigned float_to_bf16_bits(float v) {
  return static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(v)));
}
__device__ __forceinline__ void load4(const float* p, std::int64_t i, float (&v)[4]) {
  const float4 q = *reinterpret_cast<const float4*>(p + i);
  v[0] = q.x;
  v[1] = q.y;
  v[2] = q.z;
  v[3] = q.w;
}
__device__ __forceinline__ void load4(const __nv_bfloat16* p, std::int64_t i, float (&v)[4]) {
  const uint2 q = *reinterpret_cast<const uint2*>(p + i);
  v[0] = bf16_bits_to_float(static_cast<short>(q.x));  // the low 16 bits
  v[1] = bf16_bits_to_float(static_cast<short>(q.x >> 16));
  v[2] = bf16_bits_to_float(static_cast<short>(q.y));
  v[3] = bf16_bits_to_float(static_cast<short>(q.y >> 16));
}
__device__ __forceinline__ void store4(float* p, std::int64_t i, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void store4(__nv_bfloat16* p, std::int64_t i, const float (&v)[4]) {
  uint2 q;
  q.x = float_to_bf16_bits(v[0]) | (float_to_bf16_bits(v[1]) << 16);
  q.y = float_to_bf16_bits(v[2]) | (float_to_bf16_bits(v[3]) << 16);
  *reinterpret_cast<uint2*>(p + i) = q;
}

std::int64_t blocks_for(std::int64_t count) {
  const std::int64_t b = (count + kThreads - 1) / kThreads;
  return b < 1 ? 1 : (b > 65535LL * 32 ? 65535LL * 32 : b);
}

// Rows x columns launches: blockIdx.y walks rows (strided past 65535), x covers the columns.
dim3 rows_grid(std::int64_t cols, std::int64_t rows) {
  const std::int64_t x = (cols + kThreads - 1) / kThreads;
  const std::int64_t y = rows < 1 ? 1 : (rows > 65535 ? 65535 : rows);
  return dim3(static_cast<unsigned>(x < 1 ? 1 : x), static_cast<unsigned>(y));
}

template <typename T>
__global__ void square_kernel(const T* x, float* out, std::int64_t count) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float v = load(x, i);
    out[i] = __fmul_rn(v, v);  // ref: x.float().pow(2) (pow with exponent 2 is base * base)
  }
}

// One lane's share of a row's sum of squares in ATen's order (reduce_kernel<512, 1,
// ReduceOp<float, MeanOps>> where mean_sq_fits; fused_kernels.h says the order): the 4-element
// vectors lane, lane + 32, ... into four accumulators, combined in order. kQuads: each vector in
// one load (the row aligned to four elements); the same values in the same order.
template <typename T, bool kQuads>
__device__ __forceinline__ float lane_sum_sq(const T* r, int n, int lane) {
  constexpr int kLanes = 32;
  float acc[4] = {0.0F, 0.0F, 0.0F, 0.0F};
  // Unrolled so that several loads are in flight per lane (a row of 2816 is 22 rounds); each
  // accumulator still adds in the same order.
#pragma unroll 4
  for (int v = lane; v * 4 + 3 < n; v += kLanes) {
    float e[4];
    if (kQuads) {
      load4(r, v * 4, e);
    } else {
      for (int i = 0; i < 4; ++i) {
        e[i] = load(r, v * 4 + i);
      }
    }
    for (int i = 0; i < 4; ++i) {
      acc[i] = __fadd_rn(acc[i], __fmul_rn(e[i], e[i]));  // the square ATen stored, then added
    }
  }
  return __fadd_rn(__fadd_rn(__fadd_rn(acc[0], acc[1]), acc[2]), acc[3]);
}

// The first `lanes` lanes' sums (a power of two up to 32) combined by shuffles down, as
// Reduce.cuh's block_x_reduce does for a block that wide (lane 0 holds the sum; every lane of
// the warp must call). kDescending: at offsets lanes / 2, ..., 2, 1 instead of 1, 2, ...,
// lanes / 2 (MeanOrder).
template <bool kDescending>
__device__ __forceinline__ float warp_sum(float sum, int lanes = 32) {
  for (int step = 0; (1 << step) < lanes; ++step) {
    const int offset = kDescending ? (lanes >> 1) >> step : 1 << step;
    sum = __fadd_rn(sum, __shfl_down_sync(0xffffffffU, sum, offset));
  }
  return sum;
}

// ref: x.float().pow(2).mean(-1) as ATen computes it where mean_sq_fits. One warp per row.
template <typename T, bool kQuads, bool kDescending>
__global__ void mean_sq_kernel(const T* x, float* out, std::int64_t rows, int n, float factor) {
  constexpr int kLanes = 32;
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const std::int64_t warps_per_block = blockDim.x / kLanes;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * warps_per_block;
  for (std::int64_t row = blockIdx.x * warps_per_block + threadIdx.x / kLanes; row < rows;
       row += stride) {
    const float sum = warp_sum<kDescending>(lane_sum_sq<T, kQuads>(x + row * n, n, lane));
    if (lane == 0) {
      out[row] = __fmul_rn(sum, factor);  // MeanOps::project
    }
  }
}

template <typename T>
struct Norm {
  const T* x;
  const float* mean_sq;
  float eps;
  std::int64_t rows;
  int n;
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
  float* mean_out;
  bool out_strided;
  std::int64_t out_stride_b, out_stride_h, out_stride_s;
};

// Where row `row` of the result starts in a.out (NormArgs::out_strided).
template <typename T>
__device__ __forceinline__ std::int64_t out_base(const Norm<T>& a, std::int64_t row) {
  if (!a.out_strided) {
    return row * a.n;
  }
  const std::int64_t h = row % a.heads;
  const std::int64_t s = (row / a.heads) % a.seq;
  const std::int64_t b = row / (a.heads * a.seq);
  return b * a.out_stride_b + h * a.out_stride_h + s * a.out_stride_s;
}

// ref: DiffusionGemmaRMSNorm.forward: (x.float() * pow(mean_sq, -0.5)) * weight.float(),
// .type_as(x). pow(t, -0.5) is ATen's rsqrt kernel.
template <typename T>
__device__ __forceinline__ float normed(const Norm<T>& a, const T* row_x, int d, float r) {
  float y = __fmul_rn(load(row_x, d), r);
  if (a.weight != nullptr) {
    y = __fmul_rn(y, load(a.weight, d));
  }
  return round_to(a.x, y);
}

// Element d of a row after the whole tail (r = pow(mean + eps, -0.5)); stores it.
template <typename T>
__device__ __forceinline__ void tail_element(const Norm<T>& a, std::int64_t row, int d, float r) {
  const std::int64_t base = row * a.n;
  const T* row_x = a.x + base;
  float v = normed(a, row_x, d, r);
  if (a.cos != nullptr) {
    // ref: apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, each op in T.
    const int half = a.n / 2;
    const float partner = normed(a, row_x, d < half ? d + half : d - half, r);
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
    v = round_to(a.x, __fadd_rn(load(a.residual, base + d), v));  // residual + h
  }
  if (a.layer_scalar != nullptr) {
    v = round_to(a.x, __fmul_rn(v, load(a.layer_scalar, 0)));  // h *= layer_scalar
  }
  store(a.out, out_base(a, row) + d, v);
  if (a.square != nullptr) {
    a.square[base + d] = __fmul_rn(v, v);
  }
}

// The tail with the mean of squares given (ATen computed it).
template <typename T>
__global__ void norm_kernel(Norm<T> a) {
  const int d = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (d >= a.n) {
    return;
  }
  for (std::int64_t row = blockIdx.y; row < a.rows; row += gridDim.y) {
    const float r = rsqrtf(__fadd_rn(a.mean_sq[row], a.eps));
    tail_element(a, row, d, r);
  }
}

// normed() for elements d0..d0+3 of a row.
template <typename T>
__device__ __forceinline__ void normed4(const Norm<T>& a, std::int64_t base, int d0, float r,
                                        float (&v)[4]) {
  load4(a.x, base + d0, v);
  float w[4] = {1.0F, 1.0F, 1.0F, 1.0F};
  if (a.weight != nullptr) {
    load4(a.weight, d0, w);
  }
  for (int i = 0; i < 4; ++i) {
    float y = __fmul_rn(v[i], r);
    if (a.weight != nullptr) {
      y = __fmul_rn(y, w[i]);
    }
    v[i] = round_to(a.x, y);
  }
}

// The tail (tail_element's operations, in its order) for elements d0..d0+3 of a row, with
// vector loads and stores; the result stays in v (the values stored, as floats).
template <typename T>
__device__ __forceinline__ void tail_quad(const Norm<T>& a, std::int64_t row, int d0, float r,
                                          float (&v)[4]) {
  const std::int64_t base = row * a.n;
  normed4(a, base, d0, r, v);
  if (a.cos != nullptr) {
    const int half = a.n / 2;
    float partner[4];
    normed4(a, base, d0 < half ? d0 + half : d0 - half, r, partner);
    const std::int64_t s = (row / a.heads) % a.seq;
    float c[4];
    float sn[4];
    load4(a.cos, s * a.n + d0, c);
    load4(a.sin, s * a.n + d0, sn);
    for (int i = 0; i < 4; ++i) {
      const float rotated = d0 < half ? -partner[i] : partner[i];
      const float xc = round_to(a.x, __fmul_rn(v[i], c[i]));
      const float rs = round_to(a.x, __fmul_rn(rotated, sn[i]));
      v[i] = round_to(a.x, __fadd_rn(xc, rs));
    }
  }
  if (a.scale != nullptr) {
    float sc[4];
    load4(a.scale, d0, sc);
    for (int i = 0; i < 4; ++i) {
      v[i] = round_to(a.x, __fmul_rn(v[i], sc[i]));
      v[i] = round_to(a.x, __fmul_rn(v[i], a.scalar));
    }
  }
  if (a.residual != nullptr) {
    float res[4];
    load4(a.residual, base + d0, res);
    for (int i = 0; i < 4; ++i) {
      v[i] = round_to(a.x, __fadd_rn(res[i], v[i]));
    }
  }
  if (a.layer_scalar != nullptr) {
    const float ls = load(a.layer_scalar, 0);
    for (int i = 0; i < 4; ++i) {
      v[i] = round_to(a.x, __fmul_rn(v[i], ls));
    }
  }
  store4(a.out, out_base(a, row) + d0, v);
  if (a.square != nullptr) {
    const float sq[4] = {__fmul_rn(v[0], v[0]), __fmul_rn(v[1], v[1]), __fmul_rn(v[2], v[2]),
                         __fmul_rn(v[3], v[3])};
    store4(a.square, base + d0, sq);
  }
}

// The tail four elements per thread over rows x n flattened; where norm_vec_fits (n % 4 == 0,
// n % 8 == 0 with RoPE so that a quad and its partner sit on one side of the half, every
// pointer aligned).
template <typename T>
__global__ void norm_vec_kernel(Norm<T> a) {
  const int quads = a.n / 4;
  const std::int64_t count = a.rows * quads;
  for (std::int64_t q = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; q < count;
       q += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t row = q / quads;
    const int d0 = static_cast<int>(q - row * quads) * 4;
    const float r = rsqrtf(__fadd_rn(a.mean_sq[row], a.eps));
    float v[4];
    tail_quad(a, row, d0, r, v);
  }
}

// One lane's share of a row's sum of squares, mean_sq_kernel's order (lane_sum_sq), from the
// squares already in shared memory.
__device__ __forceinline__ float lane_sum_shared(const float* squares, int quads, int lane) {
  constexpr int kLanes = 32;
  float acc[4] = {0.0F, 0.0F, 0.0F, 0.0F};
  for (int v = lane; v < quads; v += kLanes) {
    for (int i = 0; i < 4; ++i) {
      acc[i] = __fadd_rn(acc[i], squares[v * 4 + i]);
    }
  }
  return __fadd_rn(__fadd_rn(__fadd_rn(acc[0], acc[1]), acc[2]), acc[3]);
}

// The whole RMSNorm in one pass, one block per row (where norm_vec_fits): the block loads the
// row's squares into shared memory at once, the first warp sums them in mean_sq_kernel's order
// (unless a.mean_sq gives the mean), every thread applies the tail to its quads, and with
// a.mean_out the first warp sums the result's squares in that order too, which is what
// mean_sq_kernel would compute from the stored result (its values are already rounded to T).
// Bitwise the two-kernel path: the same products, the same sums in the same order, the same
// tail_quad.
template <typename T, bool kDescending>
__global__ void norm_row_kernel(Norm<T> a, float factor) {
  extern __shared__ float squares[];  // [n]: x's squares, then the result's
  __shared__ float mean_shared;
  const int quads = a.n / 4;
  const int lane = static_cast<int>(threadIdx.x);  // the first warp's lanes sum
  for (std::int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    float mean = 0.0F;
    if (a.mean_sq != nullptr) {
      mean = a.mean_sq[row];
    } else {
      for (int q = static_cast<int>(threadIdx.x); q < quads; q += static_cast<int>(blockDim.x)) {
        float e[4];
        load4(a.x + row * a.n, q * 4, e);
        for (int i = 0; i < 4; ++i) {
          squares[q * 4 + i] = __fmul_rn(e[i], e[i]);  // the square ATen stored
        }
      }
      __syncthreads();
      if (threadIdx.x < 32) {
        const float sum = warp_sum<kDescending>(lane_sum_shared(squares, quads, lane));
        if (lane == 0) {
          mean_shared = __fmul_rn(sum, factor);  // MeanOps::project
        }
      }
      __syncthreads();
      mean = mean_shared;
    }
    const float r = rsqrtf(__fadd_rn(mean, a.eps));
    for (int q = static_cast<int>(threadIdx.x); q < quads; q += static_cast<int>(blockDim.x)) {
      float v[4];
      tail_quad(a, row, q * 4, r, v);
      if (a.mean_out != nullptr) {
        for (int i = 0; i < 4; ++i) {
          squares[q * 4 + i] = __fmul_rn(v[i], v[i]);
        }
      }
    }
    if (a.mean_out != nullptr) {
      __syncthreads();
      if (threadIdx.x < 32) {
        const float sum = warp_sum<kDescending>(lane_sum_shared(squares, quads, lane));
        if (lane == 0) {
          a.mean_out[row] = __fmul_rn(sum, factor);
        }
      }
    }
    __syncthreads();  // the shared squares and mean are the next row's
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

// kWidth consecutive elements from p + i: one vector access (load4 / store4) for four, which
// needs i and p aligned to four elements; the same values either way.
template <int kWidth, typename T>
__device__ __forceinline__ void load_n(const T* p, std::int64_t i, float (&v)[kWidth]) {
  if constexpr (kWidth == 4) {
    load4(p, i, v);
  } else {
    for (int e = 0; e < kWidth; ++e) {
      v[e] = load(p, i + e);
    }
  }
}
template <int kWidth, typename T>
__device__ __forceinline__ void store_n(T* p, std::int64_t i, const float (&v)[kWidth]) {
  if constexpr (kWidth == 4) {
    store4(p, i, v);
  } else {
    for (int e = 0; e < kWidth; ++e) {
      store(p, i + e, v[e]);
    }
  }
}

// ref: grouped_mm_experts_forward: (proj * sample_weights_g)[inv_perm].view(T, K, H).sum(1)
// .to(dtype). The sum follows ATen's reduce kernel for a reduction over a non-innermost
// dimension: kLanes threads along k, thread y takes k = y, y + kLanes, ... into four
// accumulators (each starting at 0), combines them in order, then the lanes combine as a tree
// (halving offsets), as block_y_reduce does. One block row per token; each thread sums kWidth
// consecutive hidden elements, each on its own in that order (the lanes and accumulators are
// compile-time, so they stay in registers).
template <typename T, int kLanes, int kWidth>
__global__ void combine_kernel(const T* proj, const float* weights, const std::int64_t* inv,
                               std::int64_t tokens, int k_count, int hidden, T* out) {
  const int h = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x) * kWidth;
  if (h >= hidden) {
    return;
  }
  for (std::int64_t t = blockIdx.y; t < tokens; t += gridDim.y) {
    const std::int64_t* slot_src = inv + t * k_count;
    const float* slot_weight = weights + t * k_count;
    float lane_value[kLanes][kWidth];
#pragma unroll
    for (int y = 0; y < kLanes; ++y) {
      float acc[kAccumulators][kWidth];
#pragma unroll
      for (int j = 0; j < kAccumulators; ++j) {
        for (int e = 0; e < kWidth; ++e) {
          acc[j][e] = 0.0F;
        }
      }
      const auto add = [&](int j, int k) {
        float p[kWidth];
        load_n<kWidth>(proj, slot_src[k] * hidden + h, p);
        const float w = slot_weight[k];
        for (int e = 0; e < kWidth; ++e) {
          acc[j][e] = __fadd_rn(acc[j][e], __fmul_rn(p[e], w));
        }
      };
      int idx = y;
      while (idx + (kAccumulators - 1) * kLanes < k_count) {
#pragma unroll
        for (int j = 0; j < kAccumulators; ++j) {
          add(j, idx + j * kLanes);
        }
        idx += kAccumulators * kLanes;
      }
#pragma unroll
      for (int j = 0; j < kAccumulators; ++j) {
        if (idx < k_count) {
          add(j, idx);
          idx += kLanes;
        }
      }
      for (int e = 0; e < kWidth; ++e) {
        float v = acc[0][e];
        for (int j = 1; j < kAccumulators; ++j) {
          v = __fadd_rn(v, acc[j][e]);
        }
        lane_value[y][e] = v;
      }
    }
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2) {
#pragma unroll
      for (int y = 0; y < offset; ++y) {
        for (int e = 0; e < kWidth; ++e) {
          lane_value[y][e] = __fadd_rn(lane_value[y][e], lane_value[y + offset][e]);
        }
      }
    }
    store_n<kWidth>(out, t * hidden + h, lane_value[0]);
  }
}

// ref: DiffusionGemmaText4MLP.forward / _default_apply_gate: act_fn(gate) * up, with ATen's
// GeluCUDAKernelImpl (tanh): 0.5 * x * (1 + tanh(kBeta * (x + kKappa * x^3))) in fp32, rounded
// to T, times up (the value to store).
template <typename T>
__device__ __forceinline__ float gelu_times(const T* tag, float x, float up, bool contract) {
  constexpr float kBeta = static_cast<float>(1.4142135623730951 * 1.1283791670955126 * 0.5);
  constexpr float kKappa = 0.044715F;
  const float cube = __fmul_rn(__fmul_rn(x, x), x);
  const float sum = contract ? __fmaf_rn(kKappa, cube, x) : __fadd_rn(x, __fmul_rn(kKappa, cube));
  const float inner = __fmul_rn(kBeta, sum);
  const float g = round_to(tag, __fmul_rn(__fmul_rn(0.5F, x), __fadd_rn(1.0F, tanhf(inner))));
  return __fmul_rn(g, up);
}

// kWidth consecutive columns per thread (four: vector accesses; the row stride, the width and
// the pointers aligned to four elements), each element on its own.
template <typename T, int kWidth>
__global__ void gelu_mul_kernel(const T* gate, const T* up, std::int64_t stride, std::int64_t rows,
                                int inter, bool contract, T* out) {
  const int j = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x) * kWidth;
  if (j >= inter) {
    return;
  }
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    float g[kWidth];
    float u[kWidth];
    load_n<kWidth>(gate, r * stride + j, g);
    load_n<kWidth>(up, r * stride + j, u);
    float o[kWidth];
    for (int e = 0; e < kWidth; ++e) {
      o[e] = gelu_times(gate, g[e], u[e], contract);
    }
    store_n<kWidth>(out, r * inter + j, o);
  }
}

// ref: DiffusionGemmaForBlockDiffusion.forward: logits.float() / cap, tanh, * cap (ATen divides
// by a CPU scalar as a multiplication by its fp32 reciprocal).
template <typename T, int kWidth>
__global__ void softcap_kernel(const T* x, float inv_cap, float cap, float* out,
                               std::int64_t count) {
  // count: elements (a multiple of kWidth)
  for (std::int64_t i = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) * kWidth;
       i < count; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x * kWidth) {
    float v[kWidth];
    load_n<kWidth>(x, i, v);
    for (int e = 0; e < kWidth; ++e) {
      v[e] = __fmul_rn(tanhf(__fmul_rn(v[e], inv_cap)), cap);
    }
    store_n<kWidth>(out, i, v);
  }
}

// ref: DiffusionGemmaDecoderModel.forward, self-conditioning input: softmax(S, -1,
// dtype=float32).to(bf16) for bf16 S, as ATen runs it for rows wider than 1024 (S converted to
// fp32, then cunn_SoftMaxForward<ILP 4> with one block of kThreads per row: 1024 in the source
// read, SoftMaxForward_getBlockSize; 512 where SoftMax_getBlockSize halves it): thread t takes
// the 4-element vectors t, t + kThreads, ... below vec_end and then the tail elements one by one
// (max, then the sum of exp(x - max) in that order, from 0). Rows that fit in shared memory run
// cunn_SoftMaxForwardSmem, whose vectors cover the row (vec_end = n); the others have a tail
// past the last whole round of kThreads vectors. The block combines the threads' sums with
// cuda_utils::BlockReduce (each warp by shuffles down, lane 0 of each warp to shared memory, the
// first warp over the warps' sums the same way, zeros past them), and each element is exp(x - max) / sum in
// fp32, rounded once to bf16 here (ATen stores fp32, and .to(bf16) rounds it). The max is exact
// in any order; only the sum's order matters, and the load check picks the shuffle order.
// The narrowest row taken: 48 KB of fp32 (a CUDA block's shared memory), past which ATen runs
// cunn_SoftMaxForward (the shared-memory variant is not ported).
constexpr std::int64_t kSoftmaxMinWidth = 12288;

template <int kThreads, bool kDescending>
__global__ void __launch_bounds__(kThreads)
    softmax_bf16_kernel(const __nv_bfloat16* x, std::int64_t n, std::int64_t vec_end,
                        __nv_bfloat16* out) {
  constexpr int kLanes = 32;
  __shared__ float warp_values[kLanes];
  __shared__ float row_value;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % kLanes;
  const int warp = tid / kLanes;
  constexpr int kWarps = kThreads / kLanes;
  const __nv_bfloat16* row = x + static_cast<std::int64_t>(blockIdx.x) * n;
  __nv_bfloat16* row_out = out + static_cast<std::int64_t>(blockIdx.x) * n;

  float m = -3.402823466e38F;  // -numeric_limits<float>::max()
  for (std::int64_t i = tid * 4LL; i < vec_end; i += 4LL * kThreads) {
    float e[4];
    load4(row, i, e);
    for (int j = 0; j < 4; ++j) {
      m = fmaxf(m, e[j]);
    }
  }
  for (std::int64_t i = vec_end + tid; i < n; i += kThreads) {
    m = fmaxf(m, load(row, i));
  }
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    m = fmaxf(m, __shfl_down_sync(0xffffffffU, m, offset));
  }
  if (lane == 0) {
    warp_values[warp] = m;
  }
  __syncthreads();
  if (warp == 0) {
    m = lane < kWarps ? warp_values[lane] : -3.402823466e38F;
    for (int offset = kLanes / 2; offset > 0; offset /= 2) {
      m = fmaxf(m, __shfl_down_sync(0xffffffffU, m, offset));
    }
    if (lane == 0) {
      row_value = m;
    }
  }
  __syncthreads();
  m = row_value;

  float sum = 0.0F;
  for (std::int64_t i = tid * 4LL; i < vec_end; i += 4LL * kThreads) {
    float e[4];
    load4(row, i, e);
    for (int j = 0; j < 4; ++j) {
      sum = __fadd_rn(sum, expf(__fsub_rn(e[j], m)));
    }
  }
  for (std::int64_t i = vec_end + tid; i < n; i += kThreads) {
    sum = __fadd_rn(sum, expf(__fsub_rn(load(row, i), m)));
  }
  sum = warp_sum<kDescending>(sum);
  __syncthreads();  // every thread has read row_value
  if (lane == 0) {
    warp_values[warp] = sum;
  }
  __syncthreads();
  if (warp == 0) {
    sum = warp_sum<kDescending>(lane < kWarps ? warp_values[lane] : 0.0F);
    if (lane == 0) {
      row_value = sum;
    }
  }
  __syncthreads();
  sum = row_value;

  for (std::int64_t i = tid * 4LL; i < vec_end; i += 4LL * kThreads) {
    float e[4];
    load4(row, i, e);
    for (int j = 0; j < 4; ++j) {
      e[j] = __fdiv_rn(expf(__fsub_rn(e[j], m)), sum);
    }
    store4(row_out, i, e);
  }
  for (std::int64_t i = vec_end + tid; i < n; i += kThreads) {
    store(row_out, i, __fdiv_rn(expf(__fsub_rn(load(row, i), m)), sum));
  }
}

// out[i] = (((parts[0][i] + parts[1][i]) + parts[2][i]) + ...) in fp32, rounded once to T: the
// batch-invariant GEMM's fixed-order reduction of its K splits (its order never depends on M).
template <class T>
__global__ void sum_splits_kernel(const float* parts, int splits, std::int64_t count, T* out) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float acc = parts[i];
    for (int s = 1; s < splits; ++s) {
      acc = __fadd_rn(acc, parts[s * count + i]);
    }
    store(out, i, acc);
  }
}

constexpr int kRouteThreads = 1024;
constexpr int kRouteMaxItems = 8;  // ids per thread: up to 8192 in all
constexpr int kRouteMaxExperts = 1024;

// ref: grouped_mm_experts_forward: torch.sort(expert_ids) (a stable radix sort on CUDA),
// perm // num_top_k, cumsum(histc(expert_ids_g)). One block: CUB's (stable) block radix sort
// of (expert id, position) with kItems ids a thread (the fewest that hold `count`: the padding
// is sorted too), shared-memory counts and the block's scan of them.
template <int kItems>
__global__ void __launch_bounds__(kRouteThreads)
    route_kernel(const std::int64_t* ids, int count, int experts, int end_bit, int top_k,
                 std::int64_t tokens_per_row, std::int64_t* perm, std::int64_t* token_of,
                 std::int32_t* offsets, std::int64_t* row_of) {
  using Sort = cub::BlockRadixSort<int, kRouteThreads, kItems, int>;
  using Scan = cub::BlockScan<int, kRouteThreads>;
  __shared__ typename Sort::TempStorage temp;
  __shared__ typename Scan::TempStorage scan_temp;
  __shared__ int counts[kRouteMaxExperts];
  const int tid = static_cast<int>(threadIdx.x);
  for (int e = tid; e < experts; e += kRouteThreads) {
    counts[e] = 0;
  }
  __syncthreads();
  int keys[kItems];
  int values[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int i = tid * kItems + j;  // blocked: thread t holds ids t*kItems .. t*kItems+kItems-1
    values[j] = i;
    keys[j] = experts;  // padding sorts last
    if (i < count) {
      const std::int64_t v = ids[i];
      if (v >= 0 && v < experts) {
        keys[j] = static_cast<int>(v);
        atomicAdd(&counts[keys[j]], 1);
      }
    }
  }
  Sort(temp).SortBlockedToStriped(keys, values, 0, end_bit);
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int rank = tid + j * kRouteThreads;  // striped
    if (rank < count) {
      const int i = values[j];
      perm[rank] = i;
      token_of[rank] = i / top_k;
      if (row_of != nullptr) {
        row_of[rank] = (i / top_k) / tokens_per_row;
      }
    }
  }
  __syncthreads();
  // cumsum over the experts (fewer than kRouteThreads): one count a thread, the block's scan.
  int run = tid < experts ? counts[tid] : 0;
  Scan(scan_temp).InclusiveSum(run, run);
  if (tid < experts) {
    offsets[tid] = run;
  }
}

// ---- the router's probabilities, top-k and weights (ref: DiffusionGemmaTextRouter.forward) ----

constexpr int kRouterWarps = 4;   // 128 threads a block, as ATen's warp softmax launches
constexpr int kRouterSlots = 32;  // SmallBitonicSort's sort size: top_k up to 32

// TopKTypeConfig<float>::convert: the radix key gatherTopK selects by (larger = larger float,
// -0 below +0, NaN above everything).
__device__ __forceinline__ unsigned radix_key(float v) {
  const unsigned x = __float_as_uint(v);
  const unsigned mask = (x & 0x80000000U) != 0U ? 0xffffffffU : 0x80000000U;
  return v == v ? (x ^ mask) : 0xffffffffU;
}

// GTOp<float, true>: NaN sorts first, then larger values.
__device__ __forceinline__ bool greater_nan_first(float a, float b) {
  return (isnan(a) && !isnan(b)) || (a > b);
}

// ref: DiffusionGemmaTextRouter.forward from the scores on, as ATen runs its ops on CUDA, one
// warp per row:
// 1. softmax(scores, -1, float32): softmax_warp_forward (PersistentSoftmax.cuh) for rows of up to
//    1024: lane l < width (the row's next power of two, at most 32) holds elements l + it *
//    width; the max and then the sum of exp(x - max) over its elements in order, from 0 (the
//    padding -inf, contributing 0), combined by shuffles xor at offsets width / 2 .. 1; each
//    probability exp(x - max) / sum.
// 2. topk(probs, k): gatherTopK keeps every element whose radix key is above the k-th largest,
//    in index order, then those equal to it in index order until k are kept; found here as k
//    rounds of a warp-wide maximum of (key, -index). SmallBitonicSort then sorts the k (value,
//    index) pairs in 32 slots (the rest invalid) with bitonicSort's network and bitonicSwap's
//    rule, 16 lanes as its 16 threads: ties come out in the network's order, not the index's.
// 3. weights / weights.sum(-1): Reduce.cuh with block width = the largest power of two <= k:
//    lane t adds (0 + w[t]) + (0 + w[t + width]) (+ two empty accumulators), and the lanes
//    combine by shuffles down (kDescending: offsets width / 2 .. 1, else 1 .. width / 2).
// 4. * per_expert_scale[index], in fp32.
template <typename T, int kIters, bool kDescending>
__global__ void __launch_bounds__(32 * kRouterWarps)
    router_topk_kernel(const T* scores, std::int64_t rows, int experts, int width, int top_k,
                       const T* per_expert_scale, float* weights, std::int64_t* index) {
  __shared__ float slot_value[kRouterWarps][kRouterSlots];
  __shared__ int slot_index[kRouterWarps][kRouterSlots];
  __shared__ bool slot_valid[kRouterWarps][kRouterSlots];
  constexpr unsigned kAll = 0xffffffffU;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kRouterWarps + warp;
  if (row >= rows) {
    return;  // the whole warp: nothing below synchronises the block
  }
  const T* x = scores + row * experts;

  // 1. softmax_warp_forward.
  float e[kIters];
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = lane + it * width;
    e[it] = (lane < width && i < experts) ? load(x, i) : -INFINITY;
  }
  float m = e[0];
#pragma unroll
  for (int it = 1; it < kIters; ++it) {
    m = m > e[it] ? m : e[it];
  }
  for (int offset = width / 2; offset > 0; offset /= 2) {
    const float o = __shfl_xor_sync(kAll, m, offset, width);
    m = m < o ? o : m;  // Max: a < b ? b : a
  }
  float sum = 0.0F;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    e[it] = expf(__fsub_rn(e[it], m));
    sum = __fadd_rn(sum, e[it]);
  }
  for (int offset = width / 2; offset > 0; offset /= 2) {
    sum = __fadd_rn(sum, __shfl_xor_sync(kAll, sum, offset, width));
  }
  unsigned key[kIters];
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    e[it] = __fdiv_rn(e[it], sum);
    key[it] = radix_key(e[it]);
  }

  // 2a. The k largest keys, ties to the lower index; the k-th key.
  unsigned taken = 0;
  unsigned kth = 0;
  for (int j = 0; j < top_k; ++j) {
    unsigned long long best = 0;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int i = lane + it * width;
      if (lane < width && i < experts && ((taken >> it) & 1U) == 0U) {
        const unsigned long long c =
            (static_cast<unsigned long long>(key[it]) << 32) |
            (0xffffffffU - static_cast<unsigned>(i));
        best = c > best ? c : best;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const unsigned long long o = __shfl_xor_sync(kAll, best, offset);
      best = o > best ? o : best;
    }
    const int won = static_cast<int>(0xffffffffU - static_cast<unsigned>(best & 0xffffffffULL));
    kth = static_cast<unsigned>(best >> 32);
    if (lane < width && won % width == lane) {
      taken |= 1U << (won / width);
    }
  }
  // 2b. gatherTopK's order: the keys above the k-th in index order, then those equal to it.
  const unsigned below = (1U << lane) - 1U;
  int filled = 0;
  for (int pass = 0; pass < 2; ++pass) {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const bool kept = lane < width && ((taken >> it) & 1U) != 0U &&
                        (pass == 0 ? key[it] > kth : key[it] == kth);
      const unsigned ballot = __ballot_sync(kAll, kept);
      if (kept) {
        const int slot = filled + __popc(ballot & below);
        slot_value[warp][slot] = e[it];
        slot_index[warp][slot] = lane + it * width;
      }
      filled += __popc(ballot);
    }
  }
  if (lane >= top_k) {
    slot_value[warp][lane] = 0.0F;  // K{}
    slot_index[warp][lane] = 0;
  }
  slot_valid[warp][lane] = lane < top_k;
  // 2c. bitonicSort<32> with bitonicSwap: lanes 0..15 as its threads.
  const auto swap_if = [&](int pos, int stride, bool dir) {
    float& ka = slot_value[warp][pos];
    float& kb = slot_value[warp][pos + stride];
    const bool va = slot_valid[warp][pos];
    const bool vb = slot_valid[warp][pos + stride];
    const bool swap = (greater_nan_first(ka, kb) && va) || !vb;
    if (swap == dir) {
      const float tk = ka;
      ka = kb;
      kb = tk;
      const int ti = slot_index[warp][pos];
      slot_index[warp][pos] = slot_index[warp][pos + stride];
      slot_index[warp][pos + stride] = ti;
      slot_valid[warp][pos] = vb;
      slot_valid[warp][pos + stride] = va;
    }
  };
  for (int size = 2; size < kRouterSlots; size *= 2) {
    const bool flag = (lane & (size / 2)) != 0;
    for (int stride = size / 2; stride > 0; stride /= 2) {
      __syncwarp();
      if (lane < kRouterSlots / 2) {
        swap_if(2 * lane - (lane & (stride - 1)), stride, flag);
      }
    }
  }
  for (int stride = kRouterSlots / 2; stride > 0; stride /= 2) {
    __syncwarp();
    if (lane < kRouterSlots / 2) {
      swap_if(2 * lane - (lane & (stride - 1)), stride, false);
    }
  }
  __syncwarp();
  const float w = lane < top_k ? slot_value[warp][lane] : 0.0F;
  const int expert = lane < top_k ? slot_index[warp][lane] : 0;

  // 3. The sum over k (Reduce.cuh's thread_reduce and block_x_reduce) and the division.
  int block_width = 1;
  while (block_width * 2 <= top_k) {
    block_width *= 2;
  }
  const float ahead = __shfl_sync(kAll, w, (lane + block_width) % 32);
  float part = 0.0F;
  if (lane < block_width) {
    const float second = lane + block_width < top_k ? __fadd_rn(0.0F, ahead) : 0.0F;
    part = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(0.0F, w), second), 0.0F), 0.0F);
  }
  const float total = __shfl_sync(kAll, warp_sum<kDescending>(part, block_width), 0);
  if (lane < top_k) {
    const std::int64_t at = row * top_k + lane;
    weights[at] = __fmul_rn(__fdiv_rn(w, total), load(per_expert_scale, expert));
    index[at] = expert;
  }
}

// ---- comparison of tapped tensors (probe::position_diff) -----------------------------------

constexpr int kDiffThreads = 256;

// Ordered integer key of a float's bits: sign-magnitude to two's complement, so adjacent floats
// are 1 apart and +0 / -0 share a key. `sign` = 2^(w-1) for the float's width w.
__device__ __forceinline__ long long ordered_key(long long bits, long long sign) {
  return bits < 0 ? -(bits + sign) : bits;
}

struct DiffAcc {
  unsigned long long differ = 0;
  float max_abs = 0.0F;
  long long max_ulp = 0;
};

// |a - b| as ATen's nan_to_num((a.float() - b.float()).abs(), 0, 3e38, 3e38) gives it.
__device__ __forceinline__ float abs_diff(float a, float b) {
  const float d = fabsf(__fsub_rn(a, b));
  if (isnan(d)) {
    return 0.0F;
  }
  return isinf(d) ? 3.0e38F : d;
}

template <typename Bits>
__device__ void diff_bits(const Bits* a, const Bits* b, std::int64_t n, DiffAcc& acc) {
  for (std::int64_t i = threadIdx.x; i < n; i += kDiffThreads) {
    acc.differ += a[i] != b[i] ? 1ULL : 0ULL;
  }
}

// One element of a float pair, given as Bits (the signed integer of the float's width).
template <typename Bits, typename Load>
__device__ __forceinline__ void diff_element(Bits x, Bits y, Load load, DiffAcc& acc) {
  constexpr long long kSign = 1LL << (sizeof(Bits) * 8 - 1);
  if (x == y) {
    return;
  }
  ++acc.differ;
  acc.max_abs = fmaxf(acc.max_abs, abs_diff(load(x), load(y)));
  const long long d = ordered_key(x, kSign) - ordered_key(y, kSign);
  acc.max_ulp = max(acc.max_ulp, d < 0 ? -d : d);
}

// Floats stored as Bits; Load turns Bits into fp32. Where both rows are 16-byte aligned, each
// thread reads 16 bytes of each at a time and skips them when equal (the common case before
// two runs diverge); the rest element by element. Counts, maxima: the order does not matter.
template <typename Bits, typename Load>
__device__ void diff_float(const Bits* a, const Bits* b, std::int64_t n, Load load, DiffAcc& acc) {
  constexpr int kPer = 16 / sizeof(Bits);
  std::int64_t start = 0;
  if (((reinterpret_cast<std::uintptr_t>(a) | reinterpret_cast<std::uintptr_t>(b)) & 15U) == 0) {
    const std::int64_t vectors = n / kPer;
    const auto* va = reinterpret_cast<const uint4*>(a);
    const auto* vb = reinterpret_cast<const uint4*>(b);
    for (std::int64_t v = threadIdx.x; v < vectors; v += kDiffThreads) {
      const uint4 x = va[v];
      const uint4 y = vb[v];
      if (x.x == y.x && x.y == y.y && x.z == y.z && x.w == y.w) {
        continue;
      }
      Bits xs[kPer];
      Bits ys[kPer];
      memcpy(xs, &x, sizeof(x));
      memcpy(ys, &y, sizeof(y));
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        diff_element(xs[j], ys[j], load, acc);
      }
    }
    start = vectors * kPer;
  }
  for (std::int64_t i = start + threadIdx.x; i < n; i += kDiffThreads) {
    diff_element(a[i], b[i], load, acc);
  }
}

__device__ __forceinline__ float f16_bits_to_float(short b) {
  return __half2float(__short_as_half(b));
}
__device__ __forceinline__ float f32_bits_to_float(int b) {
  return __int_as_float(b);
}

// The pairs travel as a kernel parameter (no device buffer, no host-to-device copy).
struct DiffBatch {
  DiffPair pairs[kDiffPairsPerLaunch];
};

__global__ void position_diff_kernel(const __grid_constant__ DiffBatch batch, int count,
                                     std::int64_t positions, float* out) {
  __shared__ unsigned long long s_differ[kDiffThreads / 32];
  __shared__ float s_abs[kDiffThreads / 32];
  __shared__ long long s_ulp[kDiffThreads / 32];
  const std::int64_t p = blockIdx.x;
  const int k = static_cast<int>(blockIdx.y);
  if (k >= count) {
    return;
  }
  const DiffPair& pair = batch.pairs[k];
  const std::int64_t n = pair.inner;
  DiffAcc acc;
  switch (pair.kind) {
    case DiffKind::Bits1:
      diff_bits(static_cast<const unsigned char*>(pair.a) + p * n,
                static_cast<const unsigned char*>(pair.b) + p * n, n, acc);
      break;
    case DiffKind::Bits2:
      diff_bits(static_cast<const unsigned short*>(pair.a) + p * n,
                static_cast<const unsigned short*>(pair.b) + p * n, n, acc);
      break;
    case DiffKind::Bits4:
      diff_bits(static_cast<const unsigned*>(pair.a) + p * n,
                static_cast<const unsigned*>(pair.b) + p * n, n, acc);
      break;
    case DiffKind::Bits8:
      diff_bits(static_cast<const unsigned long long*>(pair.a) + p * n,
                static_cast<const unsigned long long*>(pair.b) + p * n, n, acc);
      break;
    case DiffKind::BF16:
      diff_float(static_cast<const short*>(pair.a) + p * n,
                 static_cast<const short*>(pair.b) + p * n, n, bf16_bits_to_float, acc);
      break;
    case DiffKind::F16:
      diff_float(static_cast<const short*>(pair.a) + p * n,
                 static_cast<const short*>(pair.b) + p * n, n, f16_bits_to_float, acc);
      break;
    case DiffKind::F32:
      diff_float(static_cast<const int*>(pair.a) + p * n, static_cast<const int*>(pair.b) + p * n,
                 n, f32_bits_to_float, acc);
      break;
  }
  // Block reduction: warps by shuffles, then the first thread over the warps' results.
  for (int off = 16; off > 0; off /= 2) {
    acc.differ += __shfl_down_sync(0xffffffffU, acc.differ, off);
    acc.max_abs = fmaxf(acc.max_abs, __shfl_down_sync(0xffffffffU, acc.max_abs, off));
    acc.max_ulp = max(acc.max_ulp, __shfl_down_sync(0xffffffffU, acc.max_ulp, off));
  }
  const int warp = static_cast<int>(threadIdx.x) / 32;
  if (threadIdx.x % 32 == 0) {
    s_differ[warp] = acc.differ;
    s_abs[warp] = acc.max_abs;
    s_ulp[warp] = acc.max_ulp;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kDiffThreads / 32; ++w) {
      s_differ[0] += s_differ[w];
      s_abs[0] = fmaxf(s_abs[0], s_abs[w]);
      s_ulp[0] = max(s_ulp[0], s_ulp[w]);
    }
    float* o = out + static_cast<std::int64_t>(k) * 3 * positions + p;
    o[0] = n > 0 ? __fdiv_rn(static_cast<float>(s_differ[0]), static_cast<float>(n)) : 0.0F;
    o[positions] = s_abs[0];
    o[2 * positions] = __ll2float_rn(s_ulp[0]);
  }
}

int status() {
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

bool aligned4(const void* p, std::size_t elem_bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % (4 * elem_bytes) == 0;
}

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
                 static_cast<int>(a.n),
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
                 a.square,
                 a.mean_out,
                 a.out_strided,
                 a.out_stride_b,
                 a.out_stride_h,
                 a.out_stride_s};
}

}  // namespace

bool norm_vec_fits(const NormArgs& a) {
  const std::size_t elem = a.elem == Elem::BF16 ? 2 : 4;
  const auto aligned = [&](const void* p, std::size_t bytes) {
    return p == nullptr || aligned4(p, bytes);
  };
  return a.n % 4 == 0 && (a.rope_cos == nullptr || a.n % 8 == 0) && aligned(a.x, elem) &&
         aligned(a.weight, elem) && aligned(a.rope_cos, elem) && aligned(a.rope_sin, elem) &&
         aligned(a.scale, elem) && aligned(a.residual, elem) && aligned(a.out, elem) &&
         aligned(a.square, 4) &&
         (!a.out_strided ||
          (a.out_stride_b % 4 == 0 && a.out_stride_h % 4 == 0 && a.out_stride_s % 4 == 0));
}

namespace {
// MeanOps' factor for rows x n: float(outputs) / numel, the int64 numel converted to float.
float mean_factor(std::int64_t rows, std::int64_t n) {
  return static_cast<float>(rows) / static_cast<float>(rows * n);
}

// Two warps (rows) per block: a pass's 256 hidden-size rows (B=1) spread over 128 blocks, not
// 32 SMs' worth of 8-warp blocks; the order within a row does not depend on it.
constexpr int kRowThreads = 64;
unsigned row_blocks(std::int64_t rows) {
  constexpr int kWarps = kRowThreads / 32;
  const std::int64_t want = (rows + kWarps - 1) / kWarps;
  return static_cast<unsigned>(want > 65535 * 32 ? 65535 * 32 : want);
}

// One block per row, about two quads per thread (a 2816-wide row: 256 threads, 2.75 quads
// each; a 256-wide head: one warp), the row's squares in shared memory.
template <typename T>
void launch_norm_row(const NormArgs& args, cudaStream_t s) {
  const float factor = mean_factor(args.rows, args.n);
  const std::int64_t quads = args.n / 4;
  const std::int64_t warps = (quads / 2 + 31) / 32;
  const auto threads = static_cast<unsigned>(32 * (warps < 1 ? 1 : (warps > 8 ? 8 : warps)));
  const auto blocks =
      static_cast<unsigned>(args.rows > 65535LL * 32 ? 65535LL * 32 : (args.rows < 1 ? 1 : args.rows));
  const std::size_t shared = static_cast<std::size_t>(args.n) * sizeof(float);
  if (args.mean_order == MeanOrder::ShufflesDown) {
    norm_row_kernel<T, true><<<blocks, threads, shared, s>>>(typed<T>(args), factor);
  } else {
    norm_row_kernel<T, false><<<blocks, threads, shared, s>>>(typed<T>(args), factor);
  }
}
}  // namespace

int norm_apply(const NormArgs& args, void* stream) {
  const bool mean_given = args.mean_sq != nullptr || args.one_pass;
  if (args.rows < 0 || args.n < 1 || args.n > (1 << 30) || !mean_given ||
      (args.mean_out != nullptr && !args.one_pass) ||
      (args.one_pass && (!norm_vec_fits(args) || args.n > kOnePassWidth)) ||
      (args.out_strided && (args.square != nullptr || args.mean_out != nullptr ||
                            args.rope_heads < 1 || args.rope_seq < 1))) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  auto* s = static_cast<cudaStream_t>(stream);
  if (args.one_pass) {
    if (args.rows > 0) {
      if (args.elem == Elem::BF16) {
        launch_norm_row<__nv_bfloat16>(args, s);
      } else {
        launch_norm_row<float>(args, s);
      }
    }
    return status();
  }
  if (args.vectorized && norm_vec_fits(args)) {
    const std::int64_t blocks = blocks_for(args.rows * (args.n / 4));
    if (args.elem == Elem::BF16) {
      norm_vec_kernel<<<blocks, kThreads, 0, s>>>(typed<__nv_bfloat16>(args));
    } else {
      norm_vec_kernel<<<blocks, kThreads, 0, s>>>(typed<float>(args));
    }
    return status();
  }
  const dim3 grid = rows_grid(args.n, args.rows);
  if (args.elem == Elem::BF16) {
    norm_kernel<<<grid, kThreads, 0, s>>>(typed<__nv_bfloat16>(args));
  } else {
    norm_kernel<<<grid, kThreads, 0, s>>>(typed<float>(args));
  }
  return status();
}

namespace {
template <bool kDescending>
void launch_mean_sq(Elem elem, const void* x, float* out, std::int64_t rows, int n, float factor,
                    unsigned blocks, unsigned threads, cudaStream_t s) {
  const bool quads = aligned4(x, elem == Elem::BF16 ? 2 : 4);
  if (elem == Elem::BF16) {
    const auto* xb = static_cast<const __nv_bfloat16*>(x);
    if (quads) {
      mean_sq_kernel<__nv_bfloat16, true, kDescending>
          <<<blocks, threads, 0, s>>>(xb, out, rows, n, factor);
    } else {
      mean_sq_kernel<__nv_bfloat16, false, kDescending>
          <<<blocks, threads, 0, s>>>(xb, out, rows, n, factor);
    }
  } else {
    const auto* xf = static_cast<const float*>(x);
    if (quads) {
      mean_sq_kernel<float, true, kDescending><<<blocks, threads, 0, s>>>(xf, out, rows, n, factor);
    } else {
      mean_sq_kernel<float, false, kDescending><<<blocks, threads, 0, s>>>(xf, out, rows, n, factor);
    }
  }
}
}  // namespace

int mean_sq(Elem elem, const void* x, float* out, std::int64_t rows, std::int64_t n,
            MeanOrder order, void* stream) {
  if (rows < 1 || n < 4 || n % 4 != 0 || n > (1 << 30)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  auto* s = static_cast<cudaStream_t>(stream);
  const float factor = mean_factor(rows, n);
  const unsigned blocks = row_blocks(rows);
  if (order == MeanOrder::ShufflesDown) {
    launch_mean_sq<true>(elem, x, out, rows, static_cast<int>(n), factor, blocks, kRowThreads, s);
  } else {
    launch_mean_sq<false>(elem, x, out, rows, static_cast<int>(n), factor, blocks, kRowThreads, s);
  }
  return status();
}

int inverse_permutation(const std::int64_t* perm, std::int64_t* inv, std::int64_t count,
                        void* stream) {
  inverse_kernel<<<blocks_for(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(perm, inv,
                                                                                        count);
  return status();
}

namespace {

// The combine kernel compiled for `lanes` (a power of two from kLanes to 32).
template <typename T, int kWidth, int kLanes = 1>
void launch_combine(dim3 grid, cudaStream_t s, int lanes, const T* proj, const float* weights,
                    const std::int64_t* inv, std::int64_t tokens, int k_count, int hidden, T* out) {
  if constexpr (kLanes < 32) {
    if (lanes != kLanes) {
      launch_combine<T, kWidth, kLanes * 2>(grid, s, lanes, proj, weights, inv, tokens, k_count,
                                            hidden, out);
      return;
    }
  }
  combine_kernel<T, kLanes, kWidth><<<grid, kThreads, 0, s>>>(proj, weights, inv, tokens, k_count,
                                                              hidden, out);
}

template <typename T>
void combine_as(bool quads, cudaStream_t s, int lanes, const void* proj, const float* weights,
                const std::int64_t* inv, std::int64_t tokens, int k_count, std::int64_t hidden,
                void* out) {
  const auto* p = static_cast<const T*>(proj);
  auto* o = static_cast<T*>(out);
  const int h = static_cast<int>(hidden);
  if (quads && hidden % 4 == 0 && aligned4(p, sizeof(T)) && aligned4(o, sizeof(T))) {
    launch_combine<T, 4>(rows_grid(hidden / 4, tokens), s, lanes, p, weights, inv, tokens, k_count,
                         h, o);
  } else {
    launch_combine<T, 1>(rows_grid(hidden, tokens), s, lanes, p, weights, inv, tokens, k_count, h,
                         o);
  }
}

}  // namespace

int moe_combine(Elem elem, const void* proj, const float* weights, const std::int64_t* inv,
                std::int64_t tokens, int k_count, std::int64_t hidden, int lanes, bool quads,
                void* out, void* stream) {
  if (k_count < 1 || k_count > kMaxTopK || lanes < 1 || lanes > 32 || (lanes & (lanes - 1)) != 0 ||
      hidden < 1 || hidden > (1 << 30)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  auto* s = static_cast<cudaStream_t>(stream);
  if (elem == Elem::BF16) {
    combine_as<__nv_bfloat16>(quads, s, lanes, proj, weights, inv, tokens, k_count, hidden, out);
  } else {
    combine_as<float>(quads, s, lanes, proj, weights, inv, tokens, k_count, hidden, out);
  }
  return status();
}

namespace {

template <typename T>
void gelu_mul_as(bool quads, cudaStream_t s, const void* gate, const void* up, std::int64_t stride,
                 std::int64_t rows, std::int64_t inter, bool contract, void* out) {
  const auto* g = static_cast<const T*>(gate);
  const auto* u = static_cast<const T*>(up);
  auto* o = static_cast<T*>(out);
  const int i = static_cast<int>(inter);
  if (quads && inter % 4 == 0 && stride % 4 == 0 && aligned4(g, sizeof(T)) &&
      aligned4(u, sizeof(T)) && aligned4(o, sizeof(T))) {
    gelu_mul_kernel<T, 4><<<rows_grid(inter / 4, rows), kThreads, 0, s>>>(g, u, stride, rows, i,
                                                                          contract, o);
  } else {
    gelu_mul_kernel<T, 1><<<rows_grid(inter, rows), kThreads, 0, s>>>(g, u, stride, rows, i,
                                                                      contract, o);
  }
}

template <typename T>
void softcap_as(bool quads, cudaStream_t s, const void* x, float inv_cap, float cap, float* out,
                std::int64_t count) {
  const auto* p = static_cast<const T*>(x);
  if (quads && count % 4 == 0 && aligned4(p, sizeof(T)) && aligned4(out, sizeof(float))) {
    softcap_kernel<T, 4><<<blocks_for(count / 4), kThreads, 0, s>>>(p, inv_cap, cap, out, count);
  } else {
    softcap_kernel<T, 1><<<blocks_for(count), kThreads, 0, s>>>(p, inv_cap, cap, out, count);
  }
}

}  // namespace

int gelu_mul(Elem elem, const void* gate, const void* up, std::int64_t stride, std::int64_t rows,
             std::int64_t inter, bool contract, bool quads, void* out, void* stream) {
  if (inter < 1 || inter > (1 << 30)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  auto* s = static_cast<cudaStream_t>(stream);
  if (elem == Elem::BF16) {
    gelu_mul_as<__nv_bfloat16>(quads, s, gate, up, stride, rows, inter, contract, out);
  } else {
    gelu_mul_as<float>(quads, s, gate, up, stride, rows, inter, contract, out);
  }
  return status();
}

bool route_supported(std::int64_t count, std::int64_t experts) {
  // Up to 32 ids torch.sort runs SmallBitonicSort, which is not stable (measured on an H100:
  // 8 and 16 ids came out in another order): those are left to it.
  return count > 32 && count <= static_cast<std::int64_t>(kRouteThreads) * kRouteMaxItems &&
         experts >= 1 && experts < kRouteMaxExperts;
}

int route(const std::int64_t* ids, std::int64_t count, int experts, int top_k,
          std::int64_t tokens_per_row, std::int64_t* perm, std::int64_t* token_of,
          std::int32_t* offsets, std::int64_t* row_of, void* stream) {
  if (!route_supported(count, experts) || top_k < 1 || (row_of != nullptr && tokens_per_row < 1)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  int end_bit = 1;  // bits for the values 0 .. experts (the padding key)
  while ((1 << end_bit) <= experts) {
    ++end_bit;
  }
  auto* s = static_cast<cudaStream_t>(stream);
  const int n = static_cast<int>(count);
  if (count <= 2 * kRouteThreads) {
    route_kernel<2><<<1, kRouteThreads, 0, s>>>(ids, n, experts, end_bit, top_k, tokens_per_row,
                                                perm, token_of, offsets, row_of);
  } else if (count <= 4 * kRouteThreads) {
    route_kernel<4><<<1, kRouteThreads, 0, s>>>(ids, n, experts, end_bit, top_k, tokens_per_row,
                                                perm, token_of, offsets, row_of);
  } else {
    route_kernel<kRouteMaxItems><<<1, kRouteThreads, 0, s>>>(
        ids, n, experts, end_bit, top_k, tokens_per_row, perm, token_of, offsets, row_of);
  }
  return status();
}

bool router_topk_supported(std::int64_t experts, std::int64_t top_k) {
  return experts >= 1 && experts <= 1024 && top_k >= 1 && top_k <= kRouterSlots &&
         top_k <= experts;
}

namespace {

template <typename T, int kIters = 1>
void router_topk_as(const T* scores, std::int64_t rows, int experts, int width, int iters,
                    int top_k, const T* scale, MeanOrder order, float* weights,
                    std::int64_t* index, cudaStream_t s) {
  if constexpr (kIters < 32) {
    if (iters > kIters) {
      router_topk_as<T, kIters * 2>(scores, rows, experts, width, iters, top_k, scale, order,
                                    weights, index, s);
      return;
    }
  }
  const dim3 grid(static_cast<unsigned>((rows + kRouterWarps - 1) / kRouterWarps));
  if (order == MeanOrder::ShufflesDown) {
    router_topk_kernel<T, kIters, true><<<grid, 32 * kRouterWarps, 0, s>>>(
        scores, rows, experts, width, top_k, scale, weights, index);
  } else {
    router_topk_kernel<T, kIters, false><<<grid, 32 * kRouterWarps, 0, s>>>(
        scores, rows, experts, width, top_k, scale, weights, index);
  }
}

}  // namespace

int router_topk(Elem elem, const void* scores, std::int64_t rows, std::int64_t experts,
                std::int64_t top_k, const void* per_expert_scale, MeanOrder order, float* weights,
                std::int64_t* index, void* stream) {
  if (!router_topk_supported(experts, top_k) || rows < 0 ||
      (rows + kRouterWarps - 1) / kRouterWarps > 0x7fffffffLL) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (rows == 0) {
    return 0;
  }
  // softmax_warp_forward's layout: the row's next power of two, over lanes of at most 32.
  int pow2 = 1;
  while (pow2 < experts) {
    pow2 *= 2;
  }
  const int width = pow2 < 32 ? pow2 : 32;
  const int iters = pow2 / width;
  auto* s = static_cast<cudaStream_t>(stream);
  const int e = static_cast<int>(experts);
  const int k = static_cast<int>(top_k);
  if (elem == Elem::BF16) {
    router_topk_as(static_cast<const __nv_bfloat16*>(scores), rows, e, width, iters, k,
                   static_cast<const __nv_bfloat16*>(per_expert_scale), order, weights, index, s);
  } else {
    router_topk_as(static_cast<const float*>(scores), rows, e, width, iters, k,
                   static_cast<const float*>(per_expert_scale), order, weights, index, s);
  }
  return status();
}

int softcap(Elem elem, const void* x, float inv_cap, float cap, float* out, std::int64_t count,
            bool quads, void* stream) {
  auto* s = static_cast<cudaStream_t>(stream);
  if (elem == Elem::BF16) {
    softcap_as<__nv_bfloat16>(quads, s, x, inv_cap, cap, out, count);
  } else {
    softcap_as<float>(quads, s, x, inv_cap, cap, out, count);
  }
  return status();
}

bool softmax_bf16_fits(std::int64_t n) {
  return n >= kSoftmaxMinWidth && n % 4 == 0 && n <= (1LL << 40);
}

namespace {

template <int kThreads>
int softmax_bf16_as(const __nv_bfloat16* x, std::int64_t rows, std::int64_t n, MeanOrder order,
                    __nv_bfloat16* out, cudaStream_t s) {
  // host_softmax picks the shared-memory kernel where the fp32 row fits beside the warps' sums
  // (its input and output are fresh, aligned, and n % 4 == 0 here): that variant's order is not
  // the one ported (measured on an H100: rare rows of 1028 and 5000 differ in every layout), so
  // a row that fits is refused.
  int device = 0;
  int smem = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlock, device) != cudaSuccess) {
    return status();
  }
  const std::int64_t smem_elements = (static_cast<std::int64_t>(smem) - (kThreads / 32) * 4) / 4;
  if (n < smem_elements) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const std::int64_t vec_end = n - n % (4 * kThreads);
  const dim3 grid(static_cast<unsigned>(rows));
  if (order == MeanOrder::ShufflesDown) {
    softmax_bf16_kernel<kThreads, true><<<grid, kThreads, 0, s>>>(x, n, vec_end, out);
  } else {
    softmax_bf16_kernel<kThreads, false><<<grid, kThreads, 0, s>>>(x, n, vec_end, out);
  }
  return status();
}

}  // namespace

int softmax_bf16(const void* x, std::int64_t rows, std::int64_t n, MeanOrder order, int threads,
                 void* out, void* stream) {
  if (!softmax_bf16_fits(n) || rows < 0 || rows > 0x7fffffffLL || !aligned4(x, 2) ||
      !aligned4(out, 2) || (threads != 1024 && threads != 512)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (rows == 0) {
    return 0;
  }
  auto* s = static_cast<cudaStream_t>(stream);
  const auto* in = static_cast<const __nv_bfloat16*>(x);
  auto* o = static_cast<__nv_bfloat16*>(out);
  return threads == 1024 ? softmax_bf16_as<1024>(in, rows, n, order, o, s)
                         : softmax_bf16_as<512>(in, rows, n, order, o, s);
}

int sum_splits(Elem elem, const float* parts, int splits, std::int64_t count, void* out,
               void* stream) {
  auto* s = static_cast<cudaStream_t>(stream);
  if (elem == Elem::BF16) {
    sum_splits_kernel<<<blocks_for(count), kThreads, 0, s>>>(parts, splits, count,
                                                             static_cast<__nv_bfloat16*>(out));
  } else {
    sum_splits_kernel<<<blocks_for(count), kThreads, 0, s>>>(parts, splits, count,
                                                             static_cast<float*>(out));
  }
  return status();
}

int position_diff(const DiffPair* pairs, std::int64_t count, std::int64_t positions, float* out,
                  void* stream) {
  if (count <= 0 || positions <= 0) {
    return 0;
  }
  for (std::int64_t first = 0; first < count; first += kDiffPairsPerLaunch) {
    const int n =
        static_cast<int>(count - first < kDiffPairsPerLaunch ? count - first : kDiffPairsPerLaunch);
    DiffBatch batch;
    for (int i = 0; i < n; ++i) {
      batch.pairs[i] = pairs[first + i];
    }
    const dim3 grid(static_cast<unsigned>(positions), static_cast<unsigned>(n));
    position_diff_kernel<<<grid, kDiffThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        batch, n, positions, out + first * 3 * positions);
    if (const int code = status(); code != 0) {
      return code;
    }
  }
  return 0;
}

}  // namespace batchlens::kernels::cuda
