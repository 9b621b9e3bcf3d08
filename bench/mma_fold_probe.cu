// SPDX-License-Identifier: Apache-2.0
// Which tensor-core fold gives torch._grouped_mm's bits on this GPU: a shared library for
// bench/mma_fold_probe.py (ctypes, device pointers from torch), which compares what these
// kernels compute with at::_grouped_mm (CUTLASS, wgmma on sm90) and cuBLAS on the same operands.
//
// Every variant computes out[i][j] = sum over k of a[i][k] * b[j][k] (a [ra, k], b [rb, k] bf16
// row-major, out [ra, rb] fp32, not rounded) as ONE fp32 accumulator per element folded over K
// in steps of 16 from k = 0 upwards; they differ only in the instruction and the start:
//   0  mma.sync m16n8k16, accumulators start at -0 (core/kernels/expert_gemm.cu, ExpertFold::K16)
//   1  two mma.sync m16n8k8 per step of 16, from -0 (ExpertFold::K8)
//   2  mma.sync m16n8k16 from +0
//   3  wgmma m64n8k16 (A from registers, B from shared memory), the first step not reading its
//      accumulator (scale-d 0: what CUTLASS's sm90 mainloop does)
//   4  wgmma m64n8k16 from +0, every step reading its accumulator
// One block of 128 threads takes 64 rows of a and 8 rows of b, one step of 16 at a time straight
// from global memory: slow and simple, a probe of the arithmetic, not a kernel to ship.
// Build (sm_90a: wgmma), from the repository root: nvcc -O3 -std=c++17 -arch=sm_90a -shared
//   -Xcompiler -fPIC -I. -o mma_fold_probe.so bench/mma_fold_probe.cu
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/kernels/wgmma.cuh"

namespace {

__device__ __forceinline__ unsigned pair_at(const __nv_bfloat16* m, int rows, int row, int k,
                                            int col) {
  return row < rows
             ? *reinterpret_cast<const unsigned*>(m + static_cast<std::int64_t>(row) * k + col)
             : 0U;
}

__device__ __forceinline__ void mma16(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                      unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma8(float (&d)[4], unsigned a0, unsigned a1, unsigned b0) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(b0));
}

// d += a (64 x 16, registers: the warp's 16 rows as mma.sync's A fragment) * b (16 x 8, the
// shared-memory descriptor): the experts' GEMM's own wgmma step (core/kernels/wgmma.cuh).
__device__ __forceinline__ void wgmma8(float (&d)[4], const unsigned (&a)[4], std::uint64_t desc,
                                       int scale_d) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  batchlens::kernels::cuda::gemm_tile::wgmma_k16<8>(d, a, desc, scale_d);
#else
  // Built without sm_90a (no wgmma): NaN, which the script reports as such.
  (void)a;
  (void)desc;
  (void)scale_d;
  for (float& v : d) {
    v = __int_as_float(0x7fc00000);
  }
#endif
}

template <int kVariant>
__global__ void __launch_bounds__(128)
    fold_kernel(const __nv_bfloat16* __restrict__ a, int ra, const __nv_bfloat16* __restrict__ b,
                int rb, int k, float* __restrict__ out) {
  // 8 rows of b, 16 K: two no-swizzle core matrices (8 rows x 16 bytes each, K 0..7 then 8..15).
  __shared__ __align__(128) __nv_bfloat16 sb[2 * 8 * 8];
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int ia = static_cast<int>(blockIdx.x) * 64 + warp * 16 + g;  // a rows ia, ia + 8
  const int jb0 = static_cast<int>(blockIdx.y) * 8;
  const float start = (kVariant == 0 || kVariant == 1) ? -0.0F : 0.0F;
  float d[4] = {start, start, start, start};
  // The descriptor: start address >> 4 (bits 0-13); the byte offset of the next core matrix
  // along K as both leading (16-29) and stride (32-45) offset, 128 >> 4 (the stride one
  // unused with 8 rows), no swizzle (62-63 zero).
  const auto smem = static_cast<std::uint64_t>(__cvta_generic_to_shared(sb));
  const std::uint64_t desc = ((smem & 0x3FFFFULL) >> 4) | (8ULL << 16) | (8ULL << 32);
  for (int k0 = 0; k0 < k; k0 += 16) {
    const unsigned af[4] = {
        pair_at(a, ra, ia, k, k0 + 2 * t), pair_at(a, ra, ia + 8, k, k0 + 2 * t),
        pair_at(a, ra, ia, k, k0 + 2 * t + 8), pair_at(a, ra, ia + 8, k, k0 + 2 * t + 8)};
    if constexpr (kVariant <= 2) {
      const unsigned b0 = pair_at(b, rb, jb0 + g, k, k0 + 2 * t);
      const unsigned b1 = pair_at(b, rb, jb0 + g, k, k0 + 2 * t + 8);
      if constexpr (kVariant == 1) {
        mma8(d, af[0], af[1], b0);
        mma8(d, af[2], af[3], b1);
      } else {
        mma16(d, af, b0, b1);
      }
    } else {
      if (threadIdx.x < 16) {
        const int n = static_cast<int>(threadIdx.x) % 8;
        const int c = static_cast<int>(threadIdx.x) / 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (jb0 + n < rb) {
          v = *reinterpret_cast<const uint4*>(b + static_cast<std::int64_t>(jb0 + n) * k + k0 +
                                              8 * c);
        }
        *reinterpret_cast<uint4*>(sb + c * 64 + n * 8) = v;
      }
      // The generic proxy's stores made visible to wgmma's (async proxy) reads.
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      __syncthreads();
      wgmma8(d, af, desc, (kVariant == 3 && k0 == 0) ? 0 : 1);
      __syncthreads();  // every warp's MMA has read sb before the next step rewrites it
    }
  }
  const int jb = jb0 + 2 * t;
  const auto put = [&](int i, int j, float v) {
    if (i < ra && j < rb) {
      out[static_cast<std::int64_t>(i) * rb + j] = v;
    }
  };
  put(ia, jb, d[0]);
  put(ia, jb + 1, d[1]);
  put(ia + 8, jb, d[2]);
  put(ia + 8, jb + 1, d[3]);
}

template <int kVariant>
int launch(const void* a, int ra, const void* b, int rb, int k, float* out, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((ra + 63) / 64), static_cast<unsigned>((rb + 7) / 8));
  fold_kernel<kVariant><<<grid, 128, 0, s>>>(static_cast<const __nv_bfloat16*>(a), ra,
                                             static_cast<const __nv_bfloat16*>(b), rb, k, out);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

// 0 or a cudaError_t; -1: an unknown variant or a shape it cannot take (k a multiple of 16,
// pointers 16-byte aligned).
extern "C" int bl_fold_probe(int variant, const void* a, int ra, const void* b, int rb, int k,
                             float* out, void* stream) {
  const auto aligned = [](const void* p) {
    return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
  };
  if (ra < 1 || rb < 1 || k < 16 || k % 16 != 0 || !aligned(a) || !aligned(b)) {
    return -1;
  }
  auto* s = static_cast<cudaStream_t>(stream);
  switch (variant) {
    case 0:
      return launch<0>(a, ra, b, rb, k, out, s);
    case 1:
      return launch<1>(a, ra, b, rb, k, out, s);
    case 2:
      return launch<2>(a, ra, b, rb, k, out, s);
    case 3:
      return launch<3>(a, ra, b, rb, k, out, s);
    case 4:
      return launch<4>(a, ra, b, rb, k, out, s);
    default:
      return -1;
  }
}
