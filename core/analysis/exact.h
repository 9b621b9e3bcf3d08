// SPDX-License-Identifier: Apache-2.0
// The exact reference of one op (issue #35): the op recomputed in fp64 on the CPU from the
// operands it was given, and how far B=1's and B=N's results lie from it. "Which one is wrong?"
// is the first question about a bitwise difference; usually neither is, and this says how far
// each is from exact and which is closer where. Torch-free header (tensors by reference only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/experiment/exact_reference.h"

namespace at {
class Tensor;
}

namespace batchlens::analysis {

/// The distance of B=1's and B=N's results to exact (experiment/exact_reference.h: a value of
/// the experiment file).
using experiment::ExactDistance;

/// Floating-point bits (bf16/fp16 or fp32) as int64 integers ordered like the values: adjacent
/// floats are 1 apart, so differences are ULPs.
at::Tensor ordered_bits(const at::Tensor& t);

/// The op ("linear": F.linear(x, w) with w [N, K]; "matmul": a @ b; "grouped_mm": x [R, K] by
/// expert with w [E, K, N] and offs int32 [E] cumulative ends) in fp64 on the CPU. Throws
/// base::ErrorException (InvalidArgument) for another op or operands that do not fit.
at::Tensor exact_op(const std::string& op, const std::vector<at::Tensor>& operands);

/// How far `one` (B=1's result) and `batch` (row 0 of B=N's, same shape and dtype) lie from
/// `exact` (fp64, same shape): ULPs of their dtype from exact rounded to it, and per element
/// which is closer in value.
ExactDistance exact_distance(const at::Tensor& one, const at::Tensor& batch,
                             const at::Tensor& exact);

}  // namespace batchlens::analysis
