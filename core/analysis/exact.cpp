// SPDX-License-Identifier: Apache-2.0
#include "core/analysis/exact.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "core/base/error.h"

namespace batchlens::analysis {

namespace {

at::Tensor wide(const at::Tensor& t) {
  return t.detach().to(at::kCPU).to(at::kDouble);
}

}  // namespace

at::Tensor ordered_bits(const at::Tensor& t) {
  const bool wide = t.element_size() == 4;
  const at::Tensor bits = t.contiguous().view(wide ? at::kInt : at::kShort).to(at::kLong);
  const std::int64_t lowest = wide ? -(std::int64_t{1} << 31) : -(std::int64_t{1} << 15);
  return at::where(bits < 0, lowest - bits, bits);
}

at::Tensor exact_op(const std::string& op, const std::vector<at::Tensor>& operands) {
  const auto need = [&](std::size_t n) {
    if (operands.size() < n) {
      base::raise(base::ErrorCode::InvalidArgument,
                  "exact " + op + ": needs " + std::to_string(n) + " operands");
    }
  };
  if (op == "linear") {
    need(2);
    return at::linear(wide(operands[0]), wide(operands[1]));  // [..., N] fp64
  }
  if (op == "matmul") {
    need(2);
    return at::matmul(wide(operands[0]), wide(operands[1]));
  }
  if (op == "grouped_mm") {
    need(3);
    const at::Tensor x = wide(operands[0]);  // [R, K]
    const at::Tensor w = wide(operands[1]);  // [E, K, N]
    const at::Tensor ends = operands[2].to(at::kCPU).to(at::kLong);
    if (x.dim() != 2 || w.dim() != 3 || ends.dim() != 1 || ends.size(0) != w.size(0) ||
        w.size(1) != x.size(1)) {
      base::raise(base::ErrorCode::InvalidArgument, "exact grouped_mm: operands do not fit");
    }
    at::Tensor out = at::zeros({x.size(0), w.size(2)}, x.options());  // [R, N] fp64
    std::int64_t start = 0;
    for (std::int64_t e = 0; e < ends.size(0); ++e) {
      const std::int64_t end = std::min(ends[e].item<std::int64_t>(), x.size(0));
      if (end > start) {
        out.narrow(0, start, end - start).copy_(at::mm(x.narrow(0, start, end - start), w[e]));
      }
      start = std::max(start, end);
    }
    return out;
  }
  base::raise(base::ErrorCode::InvalidArgument, "no exact reference for op " + op);
}

ExactDistance exact_distance(const at::Tensor& one, const at::Tensor& batch,
                             const at::Tensor& exact) {
  ExactDistance d;
  const std::int64_t n = one.numel();
  if (n == 0 || batch.numel() != n || exact.numel() != n) {
    return d;
  }
  const at::Tensor a = one.detach().to(at::kCPU).reshape({-1});
  const at::Tensor b = batch.detach().to(at::kCPU).reshape({-1});
  const at::Tensor x = exact.detach().to(at::kCPU).to(at::kDouble).reshape({-1});
  const at::Tensor rounded = ordered_bits(x.to(a.scalar_type()));
  const at::Tensor ulp_a = (ordered_bits(a) - rounded).abs().to(at::kDouble);
  const at::Tensor ulp_b = (ordered_bits(b) - rounded).abs().to(at::kDouble);
  const at::Tensor err_a = (a.to(at::kDouble) - x).abs();
  const at::Tensor err_b = (b.to(at::kDouble) - x).abs();
  const auto share = [n](const at::Tensor& mask) {
    return static_cast<double>(mask.sum().item<std::int64_t>()) / static_cast<double>(n);
  };
  d.computed = true;
  d.elements = n;
  d.max_ulp_one = ulp_a.max().item<double>();
  d.mean_ulp_one = ulp_a.mean().item<double>();
  d.max_ulp_batch = ulp_b.max().item<double>();
  d.mean_ulp_batch = ulp_b.mean().item<double>();
  d.closer_one = share(err_a < err_b);
  d.closer_batch = share(err_b < err_a);
  d.ties = 1.0 - d.closer_one - d.closer_batch;
  d.max_abs_one = err_a.max().item<double>();
  d.max_abs_batch = err_b.max().item<double>();
  return d;
}

}  // namespace batchlens::analysis
