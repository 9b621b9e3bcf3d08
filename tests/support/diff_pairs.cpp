// SPDX-License-Identifier: Apache-2.0
#include "tests/support/diff_pairs.h"

#include <limits>

#include <ATen/ATen.h>

namespace batchlens::test {

std::pair<at::Tensor, at::Tensor> perturbed(at::ScalarType type, std::int64_t c, std::int64_t n,
                                            std::uint64_t seed) {
  at::manual_seed(seed);
  if (!at::isFloatingType(type)) {
    const at::Tensor a = at::randint(0, 50, {c, n}, at::kLong).to(type);
    at::Tensor b = a.clone();
    const at::Tensor mask = at::rand({c, n}) < 0.1;
    b.masked_fill_(mask, 7);
    return {a, b};
  }
  at::Tensor a = (at::randn({c, n}) * 100).to(type);
  a.view({-1})[0] = 0.0;
  a.view({-1})[1] = std::numeric_limits<float>::quiet_NaN();
  a.view({-1})[2] = std::numeric_limits<float>::infinity();
  a.view({-1})[3] = std::numeric_limits<float>::infinity();
  a.view({-1})[4] = std::numeric_limits<float>::quiet_NaN();
  at::Tensor b = a.clone();
  const at::Tensor f = a.to(at::kFloat);
  const at::Tensor changed = at::rand({c, n}) < 0.2;
  b = at::where(changed, (f * (1 + 1e-2 * at::randn({c, n}))).to(type), b);
  b.view({-1})[0] = -0.0;                                      // +0 vs -0: bits differ, |Δ| 0
  b.view({-1})[2] = -std::numeric_limits<float>::infinity();   // inf vs -inf
  b.view({-1})[3] = 1.0;                                       // inf vs finite
  b.view({-1})[4] = -std::numeric_limits<float>::quiet_NaN();  // NaN payloads differ by sign
  if (n > 6) {
    b[c - 1][n - 1] = -a[c - 1][n - 1];
  }
  return {a, b};
}

std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> diff_pairs(
    std::int64_t c, std::initializer_list<std::int64_t> widths, std::uint64_t seed) {
  std::vector<at::Tensor> refs;
  std::vector<at::Tensor> runs;
  for (const at::ScalarType type :
       {at::kBFloat16, at::kFloat, at::kHalf, at::kLong, at::kInt, at::kBool, at::kByte}) {
    for (const std::int64_t n : widths) {
      auto [a, b] = perturbed(type, c, n, ++seed);
      refs.push_back(a);
      runs.push_back(b);
    }
  }
  // A [C, H, D] tap (positions first, several inner dims), identical and shifted.
  refs.push_back(at::randn({c, 3, 5}).to(at::kBFloat16));
  runs.push_back(refs.back().clone());
  refs.push_back(at::randn({c, 3, 5}));
  runs.push_back((refs.back() + 1e-3).contiguous());
  return {refs, runs};
}

}  // namespace batchlens::test
