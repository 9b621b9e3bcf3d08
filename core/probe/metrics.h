// SPDX-License-Identifier: Apache-2.0
// Comparisons of two runs' tapped tensors, computed where the tensors live: only [C]-sized
// summaries travel to the host.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

namespace batchlens::probe {

/// ref [C, ...] and run [C, ...] of one row (same shape and dtype) -> [3, C] fp32 on the
/// tensors' device: per canvas position the share of elements whose bits differ, the max |Δ|
/// (0 for integer taps) and the max ULP distance (0 for integer taps). NaNs compare by bits;
/// |Δ| maps NaN to 0 and an infinite difference to 3e38. The share is the count of differing
/// elements divided by the element count in fp32. This is the definition, in ATen ops; the
/// experiment runner uses position_diffs.
at::Tensor position_diff(const at::Tensor& ref, const at::Tensor& run);

/// Row `row` (along dim 0) of a [B, C, ...] tensor: what position_diffs compares in place.
struct TapRow {
  at::Tensor tensor;  ///< [B, C, ...]
  std::int64_t row = 0;
};

/// Many position_diff in one pass: refs[i] and runs[i] are rows of [B, C, ...] tensors (one
/// element shape and dtype per pair, the same C for every pair, on one device) -> [n, 3, C]
/// fp32 on that device, row i equal to position_diff(refs[i] row, runs[i] row) bit for bit.
/// No views are made: the experiment runner compares every tap of a step this way, with one
/// kernel launch per 120 pairs on CUDA (the kernel of core/kernels, no host sync) and one read
/// of every element on the CPU; the ATen ops on other devices, for fp64 taps on CUDA, and when
/// `use_kernel` is false (base::Switches::fused_kernel("diff"): BATCHLENS_FUSED=0 or
/// BATCHLENS_FUSED_OFF names `diff`).
at::Tensor position_diffs(const std::vector<TapRow>& refs, const std::vector<TapRow>& runs,
                          bool use_kernel = true);

/// position_diffs of [C, ...] tensors (each its own single row).
at::Tensor position_diffs(const std::vector<at::Tensor>& refs, const std::vector<at::Tensor>& runs,
                          bool use_kernel = true);

/// ULP distance |key(a) - key(b)| of two bf16, fp16 or fp32 tensors, as int64: the keys order
/// floats like integers (sign-magnitude to two's complement), so adjacent floats are 1 apart.
at::Tensor ulp_distance(const at::Tensor& a, const at::Tensor& b);

/// Expert-set flips: topk ids [C, K] of two rows -> bool [C], true where the sets differ.
at::Tensor routing_flips(const at::Tensor& ref_ids, const at::Tensor& run_ids);

/// Router margin: scores [C, E] -> fp32 [C], the k-th largest minus the (k+1)-th largest
/// (how close the last chosen expert was to losing its place).
at::Tensor router_margin(const at::Tensor& scores, std::int64_t k);

}  // namespace batchlens::probe
