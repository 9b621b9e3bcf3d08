// SPDX-License-Identifier: Apache-2.0
#include "core/probe/metrics.h"

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "core/ops/op_runner.h"
#include "tests/support/diff_pairs.h"

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

TEST(Metrics, PositionDiffsEqualPositionDiffBitForBitOnTheCpu) {
  const std::int64_t c = 7;
  const auto [refs, runs] = test::diff_pairs(c, {1, 6, 33, 1000}, 10);
  const at::Tensor many = position_diffs(refs, runs);
  ASSERT_EQ(many.sizes(), (at::IntArrayRef{static_cast<std::int64_t>(refs.size()), 3, c}));
  for (std::size_t i = 0; i < refs.size(); ++i) {
    const at::Tensor one = position_diff(refs[i], runs[i]);
    EXPECT_TRUE(at::equal(many[static_cast<std::int64_t>(i)].view(at::kInt), one.view(at::kInt)))
        << "pair " << i << " (" << refs[i].scalar_type() << ", " << refs[i].sizes()
        << "): " << many[static_cast<std::int64_t>(i)] << " vs " << one;
  }
  // The perturbations are seen: some share, |Δ| and ULP are non-zero, none is NaN.
  EXPECT_GT(many.select(1, 0).sum().item<float>(), 0.0F);
  EXPECT_GT(many.select(1, 1).amax().item<float>(), 0.0F);
  EXPECT_GT(many.select(1, 2).amax().item<float>(), 0.0F);
  EXPECT_FALSE(many.isnan().any().item<bool>());
}

TEST(Metrics, PositionDiffsComparesRowsOfBatchedTensorsInPlace) {
  // Rows of [B, C, ...] taps, as the experiment runner passes them: row 0 of one against row r
  // of another, a strided tensor among them.
  at::manual_seed(4);
  const at::Tensor a = at::randn({3, 5, 4, 6}).to(at::kBFloat16);
  at::Tensor b = a.clone();
  b[2][1][3][5] = 7.0;
  b[1].fill_(0.5);
  const at::Tensor ids = at::randint(0, 9, {4, 5, 2}, at::kLong);
  const at::Tensor strided = at::randn({5, 2, 7}).transpose(0, 1);  // [2, 5, 7], not contiguous
  const std::vector<TapRow> refs{{a, 0}, {a, 2}, {a, 2}, {ids, 0}, {strided, 0}};
  const std::vector<TapRow> runs{{b, 0}, {b, 2}, {b, 1}, {ids, 3}, {strided, 1}};
  const at::Tensor many = position_diffs(refs, runs);
  ASSERT_EQ(many.sizes(), (at::IntArrayRef{5, 3, 5}));
  for (std::size_t i = 0; i < refs.size(); ++i) {
    const at::Tensor one =
        position_diff(refs[i].tensor.select(0, refs[i].row), runs[i].tensor.select(0, runs[i].row));
    EXPECT_TRUE(at::equal(many[static_cast<std::int64_t>(i)].view(at::kInt), one.view(at::kInt)))
        << "pair " << i;
  }
  EXPECT_EQ(many[0].sum().item<float>(), 0.0F);                  // row 0 is untouched
  EXPECT_EQ(many[1][0][1].item<float>(), 1.0F / 24.0F);          // one element of position 1
  EXPECT_THROW(position_diffs({{a, 3}}, {{b, 0}}), c10::Error);  // no row 3
}

TEST(Metrics, PositionDiffsMapsNanAndInfinityAsTheDefinitionSays) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor a = at::tensor({0.0F, nan, inf, inf, 1.0F}, at::kFloat).view({5, 1});
  const at::Tensor b = at::tensor({-0.0F, -nan, -inf, 2.0F, 1.0F}, at::kFloat).view({5, 1});
  const at::Tensor d = position_diffs({a}, {b})[0];  // [3, 5]
  EXPECT_EQ(d[0][0].item<float>(), 1.0F);            // +0 / -0: bits differ
  EXPECT_EQ(d[1][0].item<float>(), 0.0F);            // ... but no |Δ|
  EXPECT_EQ(d[2][0].item<float>(), 0.0F);            // ... and the same ULP key
  EXPECT_EQ(d[1][1].item<float>(), 0.0F);            // NaN |Δ| -> 0
  EXPECT_EQ(d[1][2].item<float>(), 3.0e38F);         // inf - -inf -> 3e38
  EXPECT_EQ(d[1][3].item<float>(), 3.0e38F);         // inf - 2
  EXPECT_EQ(d[0][4].item<float>(), 0.0F);
}

TEST(Metrics, PositionDiffsRefusesMismatchedPairs) {
  const at::Tensor a = at::zeros({4, 3});
  EXPECT_THROW(position_diffs({a}, {at::zeros({4, 2})}), c10::Error);
  EXPECT_THROW(position_diffs({a}, {a.to(at::kBFloat16)}), c10::Error);
  EXPECT_THROW(position_diffs({a, at::zeros({5, 3})}, {a, at::zeros({5, 3})}), c10::Error);
  EXPECT_THROW(position_diffs({a}, {}), c10::Error);
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
