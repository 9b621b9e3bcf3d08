// SPDX-License-Identifier: Apache-2.0
#include "core/probe/metrics.h"

#include <cmath>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "core/ops/op_runner.h"

namespace batchlens::probe {
namespace {

TEST(Metrics, UlpDistanceCountsRepresentableStepsAcrossZero) {
  const at::Tensor a = at::tensor({1.0F, -0.0F, 1.0F}, at::kFloat);
  const at::Tensor b = at::tensor({std::nextafter(1.0F, 2.0F), 0.0F, 1.0F}, at::kFloat);
  const at::Tensor d = ulp_distance(a, b);
  EXPECT_EQ(d[0].item<std::int64_t>(), 1);
  EXPECT_EQ(d[1].item<std::int64_t>(), 0);  // -0 and +0 are adjacent keys 0 and 0
  EXPECT_EQ(d[2].item<std::int64_t>(), 0);
  const at::Tensor x = at::tensor({-1.0F}, at::kFloat).to(at::kBFloat16);
  const at::Tensor y = at::tensor({1.0F}, at::kFloat).to(at::kBFloat16);
  // bf16 1.0 = 0x3F80: 16256 steps from 0 on each side.
  EXPECT_EQ(ulp_distance(x, y)[0].item<std::int64_t>(), 2 * 16256);
}

TEST(Metrics, PositionDiffReportsShareMaxAbsAndUlpPerPosition) {
  at::Tensor ref = at::zeros({3, 4}, at::kFloat);
  at::Tensor run = ref.clone();
  run[1][2] = 0.5F;
  const at::Tensor d = position_diff(ref, run);  // [3, C]
  ASSERT_EQ(d.sizes(), (at::IntArrayRef{3, 3}));
  EXPECT_FLOAT_EQ(d[0][1].item<float>(), 0.25F);
  EXPECT_FLOAT_EQ(d[0][0].item<float>(), 0.0F);
  EXPECT_FLOAT_EQ(d[1][1].item<float>(), 0.5F);
  EXPECT_GT(d[2][1].item<float>(), 1e8F);
  const at::Tensor ids = position_diff(at::arange(6).view({3, 2}), at::arange(6).view({3, 2}) * 2);
  EXPECT_FLOAT_EQ(ids[0][0].item<float>(), 0.5F);  // 0 == 0, 1 != 2
  EXPECT_FLOAT_EQ(ids[1][2].item<float>(), 0.0F);  // no |Δ| for integer taps
}

TEST(Metrics, RoutingFlipsIgnoreOrderAndMarginIsKthMinusNext) {
  const at::Tensor a = at::tensor({0, 1, 2, 3}, at::kLong).view({2, 2});
  const at::Tensor b = at::tensor({1, 0, 2, 4}, at::kLong).view({2, 2});
  const at::Tensor f = routing_flips(a, b);
  EXPECT_FALSE(f[0].item<bool>());
  EXPECT_TRUE(f[1].item<bool>());
  const at::Tensor scores = at::tensor({0.1F, 0.9F, 0.5F, 0.45F}, at::kFloat).view({1, 4});
  EXPECT_NEAR(router_margin(scores, 2)[0].item<float>(), 0.05F, 1e-6F);
}

TEST(EmulatedSplitK, SplitsDependOnTheRowCount) {
  EXPECT_EQ(ops::emulated_split_count(16, 1024), 8);
  EXPECT_EQ(ops::emulated_split_count(32, 1024), 4);
  EXPECT_EQ(ops::emulated_split_count(64, 1024), 2);
  EXPECT_EQ(ops::emulated_split_count(128, 1024), 1);
  EXPECT_EQ(ops::emulated_split_count(16, 64), 2);  // at most K / 32
  at::manual_seed(3);
  const at::Tensor w = at::randn({8, 256}).to(at::kBFloat16);
  const at::Tensor row = at::randn({32, 256}).to(at::kBFloat16);
  const at::Tensor one = ops::emulated_split_k_linear(row, w);
  const at::Tensor two = ops::emulated_split_k_linear(at::cat({row, row}), w);
  // Same rows, different M: a different reduction order, not bitwise equal (but close).
  EXPECT_FALSE(at::equal(one, two.narrow(0, 0, 32)));
  EXPECT_TRUE(at::allclose(one.to(at::kFloat), two.narrow(0, 0, 32).to(at::kFloat), 0.05, 0.05));
  EXPECT_TRUE(at::equal(two.narrow(0, 0, 32), two.narrow(0, 32, 32)));
}

}  // namespace
}  // namespace batchlens::probe
