// SPDX-License-Identifier: Apache-2.0
// Comparisons of two runs' tapped tensors, computed where the tensors live: only [C]-sized
// summaries travel to the host.
#pragma once

#include <ATen/core/Tensor.h>

namespace batchlens::probe {

/// ref [C, ...] and run [C, ...] of one row (same shape and dtype) -> [3, C] fp32 on the
/// tensors' device: per canvas position the share of elements whose bits differ, the max |Δ|
/// (0 for integer taps) and the max ULP distance (0 for integer taps). NaNs compare by bits.
at::Tensor position_diff(const at::Tensor& ref, const at::Tensor& run);

/// ULP distance |key(a) - key(b)| of two bf16, fp16 or fp32 tensors, as int64: the keys order
/// floats like integers (sign-magnitude to two's complement), so adjacent floats are 1 apart.
at::Tensor ulp_distance(const at::Tensor& a, const at::Tensor& b);

/// Expert-set flips: topk ids [C, K] of two rows -> bool [C], true where the sets differ.
at::Tensor routing_flips(const at::Tensor& ref_ids, const at::Tensor& run_ids);

/// Router margin: scores [C, E] -> fp32 [C], the k-th largest minus the (k+1)-th largest
/// (how close the last chosen expert was to losing its place).
at::Tensor router_margin(const at::Tensor& scores, std::int64_t k);

}  // namespace batchlens::probe
