// SPDX-License-Identifier: Apache-2.0
#include "core/probe/metrics.h"

#include <ATen/ATen.h>

namespace batchlens::probe {

namespace {

// The integer type with the float's width, to compare and order bit patterns.
at::ScalarType bits_type(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16:
    case at::kHalf:
      return at::kShort;
    case at::kFloat:
      return at::kInt;
    case at::kDouble:
      return at::kLong;
    default:
      return t;
  }
}

at::Tensor ordered_key(const at::Tensor& x) {
  const at::Tensor bits = x.contiguous().view(bits_type(x.scalar_type())).to(at::kLong);
  const std::int64_t width = static_cast<std::int64_t>(x.element_size()) * 8;
  const std::int64_t sign = std::int64_t{1} << (width - 1);
  // Negative floats: bits < 0 as signed; their magnitude is bits + 2^(w-1).
  return at::where(bits < 0, -(bits + sign), bits);
}

}  // namespace

at::Tensor ulp_distance(const at::Tensor& a, const at::Tensor& b) {
  return (ordered_key(a) - ordered_key(b)).abs();
}

at::Tensor position_diff(const at::Tensor& ref, const at::Tensor& run) {
  TORCH_CHECK(ref.sizes() == run.sizes() && ref.scalar_type() == run.scalar_type(),
              "position_diff: shapes or dtypes differ: ", ref.sizes(), " vs ", run.sizes());
  const std::int64_t c = ref.size(0);
  const at::ScalarType bt = bits_type(ref.scalar_type());
  const at::Tensor a = ref.contiguous().view({c, -1});
  const at::Tensor b = run.contiguous().view({c, -1});
  const at::Tensor ne = a.view(bt) != b.view(bt);  // [C, n]
  const at::Tensor frac = ne.to(at::kFloat).mean(1);
  if (!at::isFloatingType(ref.scalar_type())) {
    const at::Tensor zero = at::zeros_like(frac);
    return at::stack({frac, zero, zero});
  }
  const at::Tensor abs =
      at::nan_to_num((a.to(at::kFloat) - b.to(at::kFloat)).abs(), 0.0, 3.0e38, 3.0e38).amax(1);
  const at::Tensor ulp = ulp_distance(a, b).amax(1).to(at::kFloat);
  return at::stack({frac, abs, ulp});
}

at::Tensor routing_flips(const at::Tensor& ref_ids, const at::Tensor& run_ids) {
  const at::Tensor a = std::get<0>(ref_ids.sort(-1));
  const at::Tensor b = std::get<0>(run_ids.sort(-1));
  return (a != b).any(-1);
}

at::Tensor router_margin(const at::Tensor& scores, std::int64_t k) {
  const std::int64_t e = scores.size(-1);
  if (k >= e) {
    return at::full({scores.size(0)}, 3.0e38, scores.options().dtype(at::kFloat));
  }
  const at::Tensor top = std::get<0>(scores.to(at::kFloat).topk(k + 1, -1));  // [C, k+1]
  return top.select(-1, k - 1) - top.select(-1, k);
}

}  // namespace batchlens::probe
