// SPDX-License-Identifier: Apache-2.0
// A bf16 GEMM for CPUs on which LibTorch computes bf16 matmuls with ATen's own kernel (no
// oneDNN: CPUs without AVX-512, or oneDNN turned off), bitwise equal to that kernel and several
// times faster. ATen (cpublas, LibTorch 1.13) computes F.linear(x, w) one output element at a
// time, as a scalar fp32 chain over K:
//   w rows contiguous ("transa"):   acc = 0; for k: acc = acc + x[m,k] * w[n,k]   -> bf16 once
//   w columns contiguous ("notrans"): c = 0 (bf16); for k: c = bf16(c + bf16(x[m,k] * w[n,k]))
// Each chain is latency-bound. This kernel computes the very same chains, in the same order and
// with the same roundings, for 8 output columns at once (one SIMD lane per chain), so no bit
// changes; it is checked against at::linear when the model loads (check_cpu_gemm) and used only
// where that check passed. The product of two bf16 values is exact in fp32 unless it leaves
// fp32's normal range; whether ATen fuses multiply and add there (FMA in its AVX2/AVX-512
// builds, not in its default one) is what the check measures and what `fma` selects.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace batchlens::kernels {

/// Whether cpu_linear_bf16 can compute F.linear(x, w) exactly as ATen's own kernel would: CPU
/// bf16 tensors, x [..., K] with unit stride along K and rows at one stride (2-D, or contiguous),
/// w [N, K] with either unit stride along K or along N, K >= 2 and N >= 2.
bool cpu_linear_bf16_covers(const at::Tensor& x, const at::Tensor& w);

/// F.linear(x, w) (x [..., K], w [N, K]) as ATen's own CPU kernel computes it; `fma`: whether
/// that kernel fuses the transa chain's multiply-add. Returns [..., N] bf16, contiguous.
/// Requires cpu_linear_bf16_covers(x, w).
at::Tensor cpu_linear_bf16(const at::Tensor& x, const at::Tensor& w, bool fma);

/// F.linear(x, w) for CPU bf16 or fp32 tensors of any layout with a per-row result that does
/// not depend on how many rows x has: every output element is one in-order chain over K (bf16:
/// cpu_linear_bf16's, so where ATen computes bf16 matmuls itself these are its bits; fp32: an
/// fp32 chain, fused when `fma`, unlike a BLAS whose blocking follows M). The CPU side of
/// ops::Strategy::BatchInvariant. Returns [..., N] in x's dtype.
at::Tensor cpu_linear_invariant(const at::Tensor& x, const at::Tensor& w, bool fma);

/// The outcome of check_cpu_gemm.
struct CpuGemmCheck {
  bool use = false;    ///< cpu_linear_bf16 matched at::linear on every probe
  bool fma = false;    ///< the variant that matched
  std::string report;  ///< one line: used or not, and why
};

/// Compares cpu_linear_bf16 with at::linear bitwise on seeded random bf16 data at each reduction
/// length in `ks` (the model's) and the chunks emulated split-K cuts them into, in both weight
/// layouts, with 1 to 33 rows, strided rows, values whose products leave fp32's normal range,
/// NaN and infinities. Cheap (N is small; each output column is
/// computed independently, so N does not change a bit).
CpuGemmCheck check_cpu_gemm(const std::vector<std::int64_t>& ks);

}  // namespace batchlens::kernels
