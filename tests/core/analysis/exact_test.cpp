// SPDX-License-Identifier: Apache-2.0
// An op's exact reference (issue #35): fp64 on the CPU for each op kind, and the distances of two
// results from it, on values whose answer is known.
#include "core/analysis/exact.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace batchlens::analysis {
namespace {

TEST(Exact, EachOpInFp64) {
  const at::Tensor x = at::tensor({1.0, 2.0, 3.0, 4.0}, at::kDouble).view({2, 2}).to(at::kBFloat16);
  const at::Tensor w =
      at::tensor({1.0, 0.5, -1.0, 2.0}, at::kDouble).view({2, 2}).to(at::kBFloat16);
  // linear: x @ w.T
  EXPECT_TRUE(at::equal(exact_op("linear", {x, w}),
                        at::tensor({2.0, 3.0, 5.0, 5.0}, at::kDouble).view({2, 2})));
  // matmul: x @ w
  EXPECT_TRUE(at::equal(exact_op("matmul", {x, w}),
                        at::tensor({-1.0, 4.5, -1.0, 9.5}, at::kDouble).view({2, 2})));
  // grouped: row 0 by expert 0, row 1 by expert 1; w [E, K, N]
  const at::Tensor we = at::stack({w, w * 2}).to(at::kBFloat16);
  const at::Tensor offs = at::tensor({1, 2}, at::kInt);
  EXPECT_TRUE(at::equal(exact_op("grouped_mm", {x, we, offs}),
                        at::tensor({-1.0, 4.5, -2.0, 19.0}, at::kDouble).view({2, 2})));
  EXPECT_THROW(exact_op("sdpa", {x, w}), std::exception);
  EXPECT_THROW(exact_op("grouped_mm", {x, w, offs}), std::exception);
}

TEST(Exact, DistancesSayWhichResultIsCloser) {
  // Exact 1 + 2^-9 lies between two bf16 values (1 and 1 + 2^-7 are 1 ULP apart at 1).
  const at::Tensor exact = at::tensor({1.0 + 1.0 / 512, 2.0, 3.0}, at::kDouble);
  const at::Tensor one = at::tensor({1.0 + 1.0 / 128, 2.0, 3.0}, at::kDouble).to(at::kBFloat16);
  const at::Tensor batch = at::tensor({1.0, 2.0, 3.0 + 1.0 / 64}, at::kDouble).to(at::kBFloat16);
  const ExactDistance d = exact_distance(one, batch, exact);
  ASSERT_TRUE(d.computed);
  EXPECT_EQ(d.elements, 3);
  EXPECT_DOUBLE_EQ(d.max_ulp_one, 1.0);         // exact rounds to 1: one is 1 ULP off
  EXPECT_DOUBLE_EQ(d.max_ulp_batch, 1.0);       // 3 + 2^-6 is 1 ULP above 3
  EXPECT_NEAR(d.closer_batch, 1.0 / 3, 1e-12);  // element 0
  EXPECT_NEAR(d.closer_one, 1.0 / 3, 1e-12);    // element 2
  EXPECT_NEAR(d.ties, 1.0 / 3, 1e-12);          // element 1
  EXPECT_NE(d.text(4).find("B=4: max 1 ULP"), std::string::npos) << d.text(4);
  EXPECT_FALSE(exact_distance(one, batch.narrow(0, 0, 2), exact).computed);
}

}  // namespace
}  // namespace batchlens::analysis
