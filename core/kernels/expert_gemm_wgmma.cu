// SPDX-License-Identifier: Apache-2.0
// The experts' grouped GEMM of expert_gemm.cu with wgmma for its k16 step (ExpertFold::Wgmma):
// the instruction torch._grouped_mm's CUTLASS sm90 kernel folds K with, for a device whose
// mma.sync does not give its bits. Compiled for sm_90a only (wgmma is not in sm_90's PTX); on
// any other device expert_gemm_wgmma returns an error before launching.
//
// The block is expert_gemm.cu's (128 weight rows of one expert, 8 warps, cp.async stages of 64
// K); its two warpgroups each take 64 of the rows, the weights as wgmma's A operand from
// registers (the same fragments mma.sync takes), the tokens as its B operand through a
// shared-memory descriptor. The token rows of a stage are therefore stored as wgmma's no-swizzle
// K-major core matrices (8 tokens x 8 K, 128 contiguous bytes): the descriptor's leading byte
// offset is the next 8 K (128 bytes), its stride byte offset the next 8 tokens (1024 bytes), as
// CUTLASS's make_gmma_desc<Major::K> INTERLEAVE layout has them. Up to 64 tokens a tile, the
// instruction's N the tile's token groups rounded up to 8, 16, 32 or 64. The first k16 step of
// a tile does not read its accumulators (scale-d 0), as CUTLASS's mainloop's first MMA.
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/kernels/expert_gemm_tile.cuh"
#include "core/kernels/fused_kernels.h"
#include "core/kernels/wgmma.cuh"

namespace batchlens::kernels::cuda {
namespace gemm_tile {
namespace {

constexpr int kTokens = 64;  // token rows of a tile
constexpr int kStages = 4;
constexpr int kTokenElems = kTokens * kStepK;  // [group][K chunk][8 tokens][8 K]
constexpr int kStageElems = kWeightElems + kTokenElems;
constexpr int kBytes = kStages * kStageElems * 2;  // 104 KB: two blocks an SM
static_assert((kWeightElems * 2) % 128 == 0 && (kStageElems * 2) % 128 == 0,
              "the token core matrices start 128-byte aligned");

// wgmma and all that uses it exist in the sm_90a pass only.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// A stage's token rows, `rows` of them (zeros from `count` on), K from k0 to k0 + 64, as core
// matrices: token r's K chunk q at ((r / 8) * 8 + q) * 64 + (r % 8) * 8. Consecutive threads
// take consecutive tokens of one chunk: 16-byte writes to one 128-byte core matrix.
__device__ __forceinline__ void load_tokens(__nv_bfloat16* st, const __nv_bfloat16* x_rows, int k,
                                            int k0, int rows, int count) {
  for (int c = static_cast<int>(threadIdx.x); c < rows * kChunks; c += kThreads) {
    const int q = c / rows;
    const int r = c % rows;
    const bool real = r < count;
    copy16(st + ((r / 8) * kChunks + q) * 64 + (r % 8) * 8,
           x_rows + static_cast<std::int64_t>(real ? r : 0) * k + k0 + q * 8, real);
  }
}

__device__ __forceinline__ void load_stage(__nv_bfloat16* stage, const __nv_bfloat16* w_rows,
                                           const __nv_bfloat16* x_rows, int k, int k0, int rows,
                                           int count) {
  load_weights(stage, w_rows, k, k0);
  load_tokens(stage + kWeightElems, x_rows, k, k0, rows, count);
}

// The descriptor of the k16 step at kk of a stage's tokens (st): start address >> 4 (bits
// 0-13), leading byte offset 128 >> 4 (16-29), stride byte offset 1024 >> 4 (32-45), no swizzle.
__device__ __forceinline__ std::uint64_t token_desc(const __nv_bfloat16* st, int kk) {
  const auto at = static_cast<std::uint64_t>(__cvta_generic_to_shared(st + (kk / 8) * 64));
  return ((at & 0x3FFFFULL) >> 4) | (std::uint64_t{128 >> 4} << 16) |
         (std::uint64_t{(kChunks * 128) >> 4} << 32);
}

// One tile of `count` tokens from row t0 in kGroups groups of 8 (the instruction's N / 8).
template <int kGroups>
__device__ __forceinline__ void run_tile(__nv_bfloat16* smem, const __nv_bfloat16* w_rows,
                                         const __nv_bfloat16* x, __nv_bfloat16* out, int n, int k,
                                         int feature0, int t0, int count) {
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int steps = k / kStepK;
  const int rows = kGroups * 8;
  const __nv_bfloat16* x_rows = x + static_cast<std::int64_t>(t0) * k;
  float acc[kGroups * 4];
#pragma unroll
  for (float& v : acc) {
    v = 0.0F;  // never read: the first step's scale-d is 0
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) {
      load_stage(smem + s * kStageElems, w_rows, x_rows, k, s * kStepK, rows, count);
    }
    copy_commit();
  }
  for (int step = 0; step < steps; ++step) {
    copy_wait<kStages - 2>();
    // The stage's cp.async writes (generic proxy) made visible to wgmma's reads (async proxy).
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int next = step + kStages - 1;
    if (next < steps) {
      load_stage(smem + (next % kStages) * kStageElems, w_rows, x_rows, k, next * kStepK, rows,
                 count);
    }
    copy_commit();
    const __nv_bfloat16* sw = smem + (step % kStages) * kStageElems;
    const __nv_bfloat16* st = sw + kWeightElems;
    const __nv_bfloat16* wa = sw + (warp * 16 + g) * kRowElems + 2 * t;
#pragma unroll
    for (int kk = 0; kk < kStepK; kk += 16) {
      unsigned a[4];
      load_a(a, wa, kk);
      wgmma_k16<kGroups * 8>(acc, a, token_desc(st, kk), step == 0 && kk == 0 ? 0 : 1);
    }
  }
  copy_wait<0>();
  __syncthreads();  // every warp is done with the stages before the next tile refills them
  store_tile<kGroups>(acc, out, n, feature0 + warp * 16 + g, t0, count, (count + 7) / 8, t);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// 1 in the sm_90a code, 0 in any other this file is also compiled for (LibTorch's CMake may add
// its own -gencode to every CUDA file): which one the driver loaded for this device.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ int wgmma_built = 1;
#else
__device__ int wgmma_built = 0;
#endif

// Grid (n / 128, experts), as expert_gemm_kernel.
__global__ void __launch_bounds__(kThreads, 2)
    expert_gemm_wgmma_kernel(const __nv_bfloat16* __restrict__ x,
                             const __nv_bfloat16* __restrict__ w,
                             const std::int32_t* __restrict__ offs, int n, int k,
                             __nv_bfloat16* __restrict__ out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(128) unsigned char wgmma_smem[];
  auto* smem = reinterpret_cast<__nv_bfloat16*>(wgmma_smem);
  const auto [begin, end, feature0, w_rows] = expert_block(offs, w, n, k);
  for (int t0 = begin; t0 < end; t0 += kTokens) {
    const int count = min(kTokens, end - t0);
    const int groups = (count + 7) / 8;
    if (groups == 1) {
      run_tile<1>(smem, w_rows, x, out, n, k, feature0, t0, count);
    } else if (groups == 2) {
      run_tile<2>(smem, w_rows, x, out, n, k, feature0, t0, count);
    } else if (groups <= 4) {
      run_tile<4>(smem, w_rows, x, out, n, k, feature0, t0, count);
    } else {
      run_tile<8>(smem, w_rows, x, out, n, k, feature0, t0, count);
    }
  }
#else
  (void)x;
  (void)w;
  (void)offs;
  (void)n;
  (void)k;
  (void)out;
#endif
}

}  // namespace
}  // namespace gemm_tile

int expert_gemm_wgmma(const void* x, const void* w, const std::int32_t* offs, int experts, int n,
                      int k, void* out, void* stream) {
  int device = 0;
  int major = 0;
  int minor = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) {
    e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  }
  if (e == cudaSuccess) {
    e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  }
  if (e != cudaSuccess) {
    return static_cast<int>(e);
  }
  if (major != 9 || minor != 0) {
    return static_cast<int>(cudaErrorNoKernelImageForDevice);  // wgmma: sm_90a only
  }
  static const int built = [] {
    int v = 0;
    return cudaMemcpyFromSymbol(&v, gemm_tile::wgmma_built, sizeof v) == cudaSuccess ? v : 0;
  }();
  if (built != 1) {
    return static_cast<int>(cudaErrorNoKernelImageForDevice);  // the device runs other code
  }
  static const cudaError_t attr =
      cudaFuncSetAttribute(gemm_tile::expert_gemm_wgmma_kernel,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, gemm_tile::kBytes);
  if (attr != cudaSuccess) {
    return static_cast<int>(attr);
  }
  const dim3 grid(static_cast<unsigned>(n / gemm_tile::kFeatures), static_cast<unsigned>(experts));
  gemm_tile::expert_gemm_wgmma_kernel<<<grid, gemm_tile::kThreads, gemm_tile::kBytes,
                                        static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(w), offs, n, k,
      static_cast<__nv_bfloat16*>(out));
  return static_cast<int>(cudaGetLastError());
}

}  // namespace batchlens::kernels::cuda
