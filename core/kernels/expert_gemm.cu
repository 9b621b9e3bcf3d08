// SPDX-License-Identifier: Apache-2.0
// The experts' grouped GEMM for few rows per expert (the decoder pass at small B): out[r, :] =
// x[r, :] @ w[e]^T for the rows r of expert e, streaming each expert's weights once.
//
// Why its bits can be torch._grouped_mm's: PyTorch's grouped GEMM (GroupMM.cu, CUTLASS sm90,
// bf16 in, fp32 accumulator, no split-K) computes every output element as one accumulator
// folded over K in steps of 16 by tensor-core MMAs, from k = 0 upwards, and rounds it once to
// bf16 (alpha = 1, no source). This kernel folds the same element over K in the same steps of
// 16 with mma.sync (m16n8k16) and rounds it with the same conversion. Whether the hardware's
// k16 step of mma.sync gives wgmma's bits is the device's affair: the model's load check
// (check_fused_kernels) compares this kernel with at::_grouped_mm on the model's shapes and uses
// it only where every bit matched.
//
// Layout: the weight rows are the MMA's A operand (16 output features a warp), the expert's
// token rows its B operand (8 tokens an MMA), so an expert with 16 rows costs two MMAs per k16
// step instead of a 64-row tile's four. A block takes 128 features of one expert and up to
// kTokens of its rows at a time; cp.async stages of 64 K deep keep the weights streaming.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/kernels/fused_kernels.h"

namespace batchlens::kernels::cuda {
namespace {

constexpr int kGemmWarps = 8;
constexpr int kGemmThreads = kGemmWarps * 32;
constexpr int kFeatures = kGemmWarps * 16;  // weight rows (output features) a block
constexpr int kStepK = 64;                   // K of one pipeline stage
constexpr int kChunks = kStepK / 8;          // 16-byte chunks of a stage's row
// A stage's rows are padded by 8 elements (144 bytes apart): a fragment's eight rows then start
// in banks 0, 4, ..., 28, so its 32-bit loads are free of bank conflicts.
constexpr int kRowElems = kStepK + 8;

template <int kTokens, int kStages>
struct GemmTile {
  static constexpr int kWeightElems = kFeatures * kRowElems;
  static constexpr int kStageElems = (kFeatures + kTokens) * kRowElems;
  static constexpr int kBytes = kStages * kStageElems * 2;
};

__device__ __forceinline__ void copy16(void* smem, const void* gmem, bool fill) {
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = fill ? 16 : 0;  // 0: the 16 bytes are zeros, nothing is read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}

__device__ __forceinline__ void copy_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}

template <int kPending>
__device__ __forceinline__ void copy_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ unsigned load_pair(const __nv_bfloat16* p) {
  return *reinterpret_cast<const unsigned*>(p);
}

// d += a (16 x 16, row) * b (16 x 8, col), fp32 accumulators: one m16n8k16 MMA, or (kStep8)
// two m16n8k8 MMAs, K 0..7 then 8..15 (the same registers: a[0], a[1], b0 hold K 0..7).
template <bool kStep8>
__device__ __forceinline__ void mma_k16(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                        unsigned b1) {
  if constexpr (kStep8) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(b0));
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[2]), "r"(a[3]), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// One stage: the block's 128 weight rows and `rows` token rows (zeros from `count` on), K from
// k0 to k0 + 64.
template <int kTokens, int kStages>
__device__ __forceinline__ void load_stage(__nv_bfloat16* stage, const __nv_bfloat16* w_rows,
                                           const __nv_bfloat16* x_rows, int k, int k0, int rows,
                                           int count) {
  __nv_bfloat16* sw = stage;
  __nv_bfloat16* sx = stage + GemmTile<kTokens, kStages>::kWeightElems;
  for (int c = static_cast<int>(threadIdx.x); c < kFeatures * kChunks; c += kGemmThreads) {
    const int r = c / kChunks;
    const int q = c % kChunks;
    copy16(sw + r * kRowElems + q * 8, w_rows + static_cast<std::int64_t>(r) * k + k0 + q * 8,
           true);
  }
  for (int c = static_cast<int>(threadIdx.x); c < rows * kChunks; c += kGemmThreads) {
    const int r = c / kChunks;
    const int q = c % kChunks;
    const bool real = r < count;
    copy16(sx + r * kRowElems + q * 8,
           x_rows + static_cast<std::int64_t>(real ? r : 0) * k + k0 + q * 8, real);
  }
}

// Grid (n / 128, experts). x [R, k] bf16, rows sorted by expert; w [experts, n, k] bf16 (the
// weights before grouped_mm's transpose); offs [experts] int32 cumulative ends; out [R, n].
template <int kTokens, int kStages, bool kStep8>
__global__ void __launch_bounds__(kGemmThreads, 2)
    expert_gemm_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                       const std::int32_t* __restrict__ offs, int n, int k,
                       __nv_bfloat16* __restrict__ out) {
  using Tile = GemmTile<kTokens, kStages>;
  constexpr int kGroups = kTokens / 8;
  extern __shared__ __align__(16) unsigned char gemm_smem[];
  auto* smem = reinterpret_cast<__nv_bfloat16*>(gemm_smem);
  const int expert = static_cast<int>(blockIdx.y);
  const int begin = expert == 0 ? 0 : offs[expert - 1];
  const int end = offs[expert];
  const int feature0 = static_cast<int>(blockIdx.x) * kFeatures;
  const __nv_bfloat16* w_rows = w + (static_cast<std::int64_t>(expert) * n + feature0) * k;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4;  // the fragment's row (feature) and column (token) group
  const int t = lane % 4;
  const int steps = k / kStepK;
  for (int t0 = begin; t0 < end; t0 += kTokens) {
    const int count = min(kTokens, end - t0);
    const int groups = (count + 7) / 8;
    const __nv_bfloat16* x_rows = x + static_cast<std::int64_t>(t0) * k;
    // -0 + p is p for every p (+0 included): the first MMA adds its products to nothing, as the
    // reference's first MMA (which does not read its accumulator) does.
    float acc[kGroups][4];
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc[j][i] = -0.0F;
      }
    }
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < steps) {
        load_stage<kTokens, kStages>(smem + s * Tile::kStageElems, w_rows, x_rows, k, s * kStepK,
                                     groups * 8, count);
      }
      copy_commit();
    }
    for (int step = 0; step < steps; ++step) {
      copy_wait<kStages - 2>();
      __syncthreads();
      const int next = step + kStages - 1;
      if (next < steps) {
        load_stage<kTokens, kStages>(smem + (next % kStages) * Tile::kStageElems, w_rows, x_rows,
                                     k, next * kStepK, groups * 8, count);
      }
      copy_commit();
      const __nv_bfloat16* sw = smem + (step % kStages) * Tile::kStageElems;
      const __nv_bfloat16* sx = sw + Tile::kWeightElems;
      const __nv_bfloat16* wa = sw + (warp * 16 + g) * kRowElems + 2 * t;
#pragma unroll
      for (int kk = 0; kk < kStepK; kk += 16) {
        // A: rows g and g + 8 of the warp's 16 features, K pairs 2t and 2t + 8.
        const unsigned a[4] = {load_pair(wa + kk), load_pair(wa + 8 * kRowElems + kk),
                               load_pair(wa + kk + 8), load_pair(wa + 8 * kRowElems + kk + 8)};
#pragma unroll
        for (int j = 0; j < kGroups; ++j) {
          if (j < groups) {
            // B: token 8j + g, K pairs 2t and 2t + 8.
            const __nv_bfloat16* xb = sx + (j * 8 + g) * kRowElems + kk + 2 * t;
            mma_k16<kStep8>(acc[j], a, load_pair(xb), load_pair(xb + 8));
          }
        }
      }
    }
    copy_wait<0>();
    __syncthreads();  // every warp is done with the stages before the next rows refill them
    // D: features g and g + 8 of the warp's 16, tokens 8j + 2t and 8j + 2t + 1.
    const int f = feature0 + warp * 16 + g;
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      const int tok = j * 8 + 2 * t;
      if (j < groups && tok < count) {
        __nv_bfloat16* o = out + static_cast<std::int64_t>(t0 + tok) * n + f;
        o[0] = __float2bfloat16_rn(acc[j][0]);
        o[8] = __float2bfloat16_rn(acc[j][2]);
        if (tok + 1 < count) {
          o[n] = __float2bfloat16_rn(acc[j][1]);
          o[n + 8] = __float2bfloat16_rn(acc[j][3]);
        }
      }
    }
  }
}

template <int kTokens, int kStages, bool kStep8>
int launch_expert_gemm(const void* x, const void* w, const std::int32_t* offs, int experts, int n,
                       int k, void* out, cudaStream_t s) {
  using Tile = GemmTile<kTokens, kStages>;
  static const cudaError_t attr = cudaFuncSetAttribute(
      expert_gemm_kernel<kTokens, kStages, kStep8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      Tile::kBytes);
  if (attr != cudaSuccess) {
    return static_cast<int>(attr);
  }
  const dim3 grid(static_cast<unsigned>(n / kFeatures), static_cast<unsigned>(experts));
  expert_gemm_kernel<kTokens, kStages, kStep8><<<grid, kGemmThreads, Tile::kBytes, s>>>(
      static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(w), offs, n, k,
      static_cast<__nv_bfloat16*>(out));
  return static_cast<int>(cudaGetLastError());
}

template <bool kStep8>
int expert_gemm_as(const void* x, const void* w, const std::int32_t* offs, std::int64_t rows,
                   int experts, int n, int k, void* out, cudaStream_t s) {
  // 64 rows at a time with four stages, or 128 with three (both 108 KB: two blocks an SM).
  if (rows <= 32 * static_cast<std::int64_t>(experts)) {
    return launch_expert_gemm<64, 4, kStep8>(x, w, offs, experts, n, k, out, s);
  }
  return launch_expert_gemm<128, 3, kStep8>(x, w, offs, experts, n, k, out, s);
}

}  // namespace

bool expert_gemm_supported(std::int64_t rows, std::int64_t experts, std::int64_t n,
                           std::int64_t k) {
  return experts >= 1 && experts <= 65535 && n >= kFeatures && n % kFeatures == 0 &&
         n <= (std::int64_t{1} << 24) && k >= kStepK && k % kStepK == 0 &&
         k <= (std::int64_t{1} << 20) && rows >= 0 && rows < (std::int64_t{1} << 31) / k &&
         rows < (std::int64_t{1} << 31) / n;
}

int expert_gemm(const void* x, const void* w, const std::int32_t* offs, std::int64_t rows,
                std::int64_t experts, std::int64_t n, std::int64_t k, ExpertFold fold, void* out,
                void* stream) {
  if (!expert_gemm_supported(rows, experts, n, k)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (rows == 0) {
    return 0;
  }
  auto* s = static_cast<cudaStream_t>(stream);
  const auto e = static_cast<int>(experts);
  const auto nn = static_cast<int>(n);
  const auto kk = static_cast<int>(k);
  return fold == ExpertFold::K8 ? expert_gemm_as<true>(x, w, offs, rows, e, nn, kk, out, s)
                                : expert_gemm_as<false>(x, w, offs, rows, e, nn, kk, out, s);
}

}  // namespace batchlens::kernels::cuda
