// SPDX-License-Identifier: Apache-2.0
// Seeded pairs of tapped-tensor stand-ins for the comparison metrics' tests (CPU and GPU).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace batchlens::test {

/// A [c, n] tensor of `type` and a copy with a seeded share of elements changed: small steps,
/// sign flips, -0 for +0, NaNs (same and different payloads) and infinities (floats), or other
/// values (integers and bool).
std::pair<at::Tensor, at::Tensor> perturbed(at::ScalarType type, std::int64_t c, std::int64_t n,
                                            std::uint64_t seed);

/// perturbed() pairs of every tap dtype (bf16, fp32, fp16, int64, int32, bool, uint8) and each
/// inner width in `widths`, plus a [c, 3, 5] bf16 identical pair and a [c, 3, 5] fp32 shifted
/// one; on the CPU.
std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> diff_pairs(
    std::int64_t c, std::initializer_list<std::int64_t> widths, std::uint64_t seed);

}  // namespace batchlens::test
