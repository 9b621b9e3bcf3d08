// SPDX-License-Identifier: Apache-2.0
// What the experts' GEMM kernels share (expert_gemm.cu: mma.sync; expert_gemm_wgmma.cu: wgmma):
// the block's shape (128 weight rows, 8 warps), the cp.async stages of 64 K and the weight rows'
// padded shared-memory layout, from which each warp loads its 16 rows as the MMA's A fragment.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace batchlens::kernels::cuda::gemm_tile {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kFeatures = kWarps * 16;  // weight rows (output features) a block
constexpr int kStepK = 64;              // K of one pipeline stage
constexpr int kChunks = kStepK / 8;     // 16-byte chunks of a stage's row
// A stage's weight rows are padded by 8 elements (144 bytes apart): a fragment's eight rows then
// start in banks 0, 4, ..., 28, so its 32-bit loads are free of bank conflicts.
constexpr int kRowElems = kStepK + 8;
constexpr int kWeightElems = kFeatures * kRowElems;  // a stage's weight rows

// A block's share of the grid (n / 128, experts): its expert's rows [begin, end) of x, its first
// output feature and that feature's weight row (w [experts, n, k]).
struct ExpertBlock {
  int begin;
  int end;
  int feature0;
  const __nv_bfloat16* w_rows;
};

__device__ __forceinline__ ExpertBlock expert_block(const std::int32_t* offs,
                                                    const __nv_bfloat16* w, int n, int k) {
  const int expert = static_cast<int>(blockIdx.y);
  const int feature0 = static_cast<int>(blockIdx.x) * kFeatures;
  return {expert == 0 ? 0 : offs[expert - 1], offs[expert], feature0,
          w + (static_cast<std::int64_t>(expert) * n + feature0) * k};
}

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

// The block's 128 weight rows of one stage, K from k0 to k0 + 64 (w_rows: the block's first row).
__device__ __forceinline__ void load_weights(__nv_bfloat16* sw, const __nv_bfloat16* w_rows, int k,
                                             int k0) {
  for (int c = static_cast<int>(threadIdx.x); c < kFeatures * kChunks; c += kThreads) {
    const int r = c / kChunks;
    const int q = c % kChunks;
    copy16(sw + r * kRowElems + q * 8, w_rows + static_cast<std::int64_t>(r) * k + k0 + q * 8,
           true);
  }
}

// The warp's A fragment of the k16 step at kk: rows g and g + 8 of its 16 features, K pairs 2t
// and 2t + 8 (wa: the stage's row warp * 16 + g, column 2t).
__device__ __forceinline__ void load_a(unsigned (&a)[4], const __nv_bfloat16* wa, int kk) {
  a[0] = load_pair(wa + kk);
  a[1] = load_pair(wa + 8 * kRowElems + kk);
  a[2] = load_pair(wa + kk + 8);
  a[3] = load_pair(wa + 8 * kRowElems + kk + 8);
}

// D of the block's tile: features g and g + 8 of the warp's 16 (f: the first), tokens 8j + 2t
// and 8j + 2t + 1 of `count` from row t0, rounded once to bf16 (acc[4j + i]: the i-th value of
// token group j, mma.sync's and wgmma's accumulator layout alike).
template <int kGroups>
__device__ __forceinline__ void store_tile(const float* acc, __nv_bfloat16* out, int n, int f,
                                           int t0, int count, int groups, int t) {
#pragma unroll
  for (int j = 0; j < kGroups; ++j) {
    const int tok = j * 8 + 2 * t;
    if (j < groups && tok < count) {
      __nv_bfloat16* o = out + static_cast<std::int64_t>(t0 + tok) * n + f;
      o[0] = __float2bfloat16_rn(acc[4 * j]);
      o[8] = __float2bfloat16_rn(acc[4 * j + 2]);
      if (tok + 1 < count) {
        o[n] = __float2bfloat16_rn(acc[4 * j + 1]);
        o[n + 8] = __float2bfloat16_rn(acc[4 * j + 3]);
      }
    }
  }
}

}  // namespace batchlens::kernels::cuda::gemm_tile
