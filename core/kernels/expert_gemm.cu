// SPDX-License-Identifier: Apache-2.0
// The experts' grouped GEMM for few rows per expert (the decoder pass at small B): out[r, :] =
// x[r, :] @ w[e]^T for the rows r of expert e, streaming each expert's weights once.
//
// Why its bits can be torch._grouped_mm's: PyTorch's grouped GEMM (GroupMM.cu, CUTLASS sm90,
// bf16 in, fp32 accumulator, no split-K) computes every output element as one accumulator
// folded over K in steps of 16 by tensor-core MMAs, from k = 0 upwards, and rounds it once to
// bf16 (alpha = 1, no source). This kernel folds the same element over K in the same steps of
// 16 with mma.sync (m16n8k16) and rounds it with the same conversion. Whether the hardware's
// k16 step of mma.sync gives wgmma's bits is the device's affair (bench/mma_fold_probe.py asks
// it; expert_gemm_wgmma.cu does the step with wgmma itself): the model's load check
// (check_fused_kernels) compares this kernel with at::_grouped_mm on the model's shapes and uses
// it only where every bit matched.
//
// Layout: the weight rows are the MMA's A operand (16 output features a warp), the expert's
// token rows its B operand (8 tokens an MMA), so an expert with 16 rows costs two MMAs per k16
// step instead of a 64-row tile's four. A block takes 128 features of one expert and up to
// kTokens of its rows at a time; cp.async stages of 64 K deep keep the weights streaming.
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/kernels/expert_gemm_tile.cuh"
#include "core/kernels/fused_kernels.h"

namespace batchlens::kernels::cuda {
namespace {

using gemm_tile::kChunks;
using gemm_tile::kFeatures;
using gemm_tile::kRowElems;
using gemm_tile::kStepK;
using gemm_tile::kWeightElems;
constexpr int kGemmThreads = gemm_tile::kThreads;

template <int kTokens, int kStages>
struct GemmTile {
  static constexpr int kStageElems = (kFeatures + kTokens) * kRowElems;
  static constexpr int kBytes = kStages * kStageElems * 2;
};

// d += a (16 x 16, row) * b (16 x 8, col), fp32 accumulators: one m16n8k16 MMA, or (kStep8)
// two m16n8k8 MMAs, K 0..7 then 8..15 (the same registers: a[0], a[1], b0 hold K 0..7).
template <bool kStep8>
__device__ __forceinline__ void mma_k16(float* d, const unsigned (&a)[4], unsigned b0,
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
__device__ __forceinline__ void load_stage(__nv_bfloat16* stage, const __nv_bfloat16* w_rows,
                                           const __nv_bfloat16* x_rows, int k, int k0, int rows,
                                           int count) {
  gemm_tile::load_weights(stage, w_rows, k, k0);
  __nv_bfloat16* sx = stage + kWeightElems;
  for (int c = static_cast<int>(threadIdx.x); c < rows * kChunks; c += kGemmThreads) {
    const int r = c / kChunks;
    const int q = c % kChunks;
    const bool real = r < count;
    gemm_tile::copy16(sx + r * kRowElems + q * 8,
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
  const auto [begin, end, feature0, w_rows] = gemm_tile::expert_block(offs, w, n, k);
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
    float acc[kGroups * 4];
#pragma unroll
    for (float& v : acc) {
      v = -0.0F;
    }
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < steps) {
        load_stage(smem + s * Tile::kStageElems, w_rows, x_rows, k, s * kStepK, groups * 8, count);
      }
      gemm_tile::copy_commit();
    }
    for (int step = 0; step < steps; ++step) {
      gemm_tile::copy_wait<kStages - 2>();
      __syncthreads();
      const int next = step + kStages - 1;
      if (next < steps) {
        load_stage(smem + (next % kStages) * Tile::kStageElems, w_rows, x_rows, k, next * kStepK,
                   groups * 8, count);
      }
      gemm_tile::copy_commit();
      const __nv_bfloat16* sw = smem + (step % kStages) * Tile::kStageElems;
      const __nv_bfloat16* sx = sw + kWeightElems;
      const __nv_bfloat16* wa = sw + (warp * 16 + g) * kRowElems + 2 * t;
#pragma unroll
      for (int kk = 0; kk < kStepK; kk += 16) {
        unsigned a[4];
        gemm_tile::load_a(a, wa, kk);
#pragma unroll
        for (int j = 0; j < kGroups; ++j) {
          if (j < groups) {
            // B: token 8j + g, K pairs 2t and 2t + 8.
            const __nv_bfloat16* xb = sx + (j * 8 + g) * kRowElems + kk + 2 * t;
            mma_k16<kStep8>(acc + 4 * j, a, gemm_tile::load_pair(xb), gemm_tile::load_pair(xb + 8));
          }
        }
      }
    }
    gemm_tile::copy_wait<0>();
    __syncthreads();  // every warp is done with the stages before the next rows refill them
    gemm_tile::store_tile<kGroups>(acc, out, n, feature0 + warp * 16 + g, t0, count, groups, t);
  }
}

template <int kTokens, int kStages, bool kStep8>
int launch_expert_gemm(const void* x, const void* w, const std::int32_t* offs, int experts, int n,
                       int k, void* out, cudaStream_t s) {
  using Tile = GemmTile<kTokens, kStages>;
  static const cudaError_t attr =
      cudaFuncSetAttribute(expert_gemm_kernel<kTokens, kStages, kStep8>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kBytes);
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
  switch (fold) {
    case ExpertFold::K16:
      return expert_gemm_as<false>(x, w, offs, rows, e, nn, kk, out, s);
    case ExpertFold::K8:
      return expert_gemm_as<true>(x, w, offs, rows, e, nn, kk, out, s);
    case ExpertFold::Wgmma:
      return expert_gemm_wgmma(x, w, offs, e, nn, kk, out, stream);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace batchlens::kernels::cuda
