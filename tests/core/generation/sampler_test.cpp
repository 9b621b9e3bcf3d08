// SPDX-License-Identifier: Apache-2.0
#include "core/generation/sampler.h"

#include <cmath>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace batchlens::generation {
namespace {

TEST(Temperature, LinearFromTMaxAtTheFirstStepTowardsTMin) {
  const SamplerConfig c;  // 48 steps, 0.8 -> 0.4
  const at::Tensor first = temperature(48, c, at::kCPU);
  EXPECT_EQ(first.scalar_type(), at::kFloat);
  EXPECT_EQ(first.dim(), 0);
  EXPECT_FLOAT_EQ(first.item<float>(), 0.8F);
  // The last step (cur_step 1) never reaches t_min: 0.4 + 0.4/48, computed in fp32.
  const float last = temperature(1, c, at::kCPU).item<float>();
  const float expected = 0.4F + static_cast<float>(0.4000000000000001) * (1.0F / 48.0F);
  EXPECT_FLOAT_EQ(last, expected);
  EXPECT_NEAR(last, 0.408333, 1e-6);
  EXPECT_GT(temperature(2, c, at::kCPU).item<float>(), last);
}

TEST(TokenEntropy, MatchesTheDefinitionOnHandMadeDistributions) {
  const std::int64_t v = 8;
  at::Tensor logits = at::zeros({1, 3, v});
  logits[0][1][2] = 50.0;                                    // nearly one-hot
  logits[0][2] = at::log(at::arange(1, v + 1, at::kFloat));  // p proportional to 1..8
  const at::Tensor h = token_entropy(logits);
  ASSERT_EQ(h.sizes(), (at::IntArrayRef{1, 3}));
  EXPECT_NEAR(h[0][0].item<double>(), std::log(8.0), 1e-6);  // uniform
  EXPECT_LT(h[0][1].item<double>(), 1e-12 + 1e-15);
  double expected = 0.0;
  for (int i = 1; i <= v; ++i) {
    const double p = i / 36.0;
    expected -= p * std::log(p);
  }
  EXPECT_NEAR(h[0][2].item<double>(), expected, 1e-6);
  // -inf logits (masked tokens) are finite in the sum thanks to the clamp.
  at::Tensor masked = at::zeros({1, 1, 4});
  masked[0][0][3] = -INFINITY;
  EXPECT_NEAR(token_entropy(masked)[0][0].item<double>(), std::log(3.0), 1e-6);
}

TEST(EntropyBound, AcceptsLowestEntropyPositionsUnderTheBound) {
  // Sorted 0.01, 0.03, 0.05, 0.5: sum of the others stays <= 0.1 for all four (the largest,
  // 0.5, is the running maximum and is not counted).
  const at::Tensor a = entropy_bound_mask(at::tensor({0.05, 0.01, 0.5, 0.03}).view({1, 4}), 0.1);
  EXPECT_TRUE(a.all().item<bool>());
  // 0.2, 0.3, 0.4: only the lowest is accepted (0.2 alone; adding 0.3 counts 0.2 > 0.1).
  const at::Tensor b = entropy_bound_mask(at::tensor({0.4, 0.2, 0.3}).view({1, 3}), 0.1);
  EXPECT_TRUE(at::equal(b, at::tensor({0, 1, 0}).to(at::kBool).view({1, 3})));
  // Rows are independent; the lowest-entropy position is always accepted.
  const at::Tensor c = entropy_bound_mask(at::tensor({9.0, 8.0, 0.0, 0.05}).view({2, 2}), 0.1);
  EXPECT_TRUE(at::equal(c, at::tensor({0, 1, 1, 1}).to(at::kBool).view({2, 2})));
}

TEST(RandomStreams, PerRowStreamsAreTheSameAtEveryBatchSize) {
  const std::int64_t v = 1000;
  const std::int64_t c = 16;
  RandomStreams one(RngMode::PerRow, 42, 1, at::kCPU);
  RandomStreams four(RngMode::PerRow, 42, 4, at::kCPU);
  const at::Tensor probs1 = at::softmax(at::randn({c, v}), -1);
  const at::Tensor probs4 = probs1.repeat({4, 1});
  for (int step = 0; step < 3; ++step) {
    const at::Tensor a1 = one.randint(v, c);
    const at::Tensor a4 = four.randint(v, c);
    EXPECT_TRUE(at::equal(a4[0], a1[0])) << "step " << step;
    EXPECT_FALSE(at::equal(a4[1], a4[0]));  // other rows have their own streams
    const at::Tensor m1 = one.multinomial(probs1);
    const at::Tensor m4 = four.multinomial(probs4);
    EXPECT_TRUE(at::equal(m4.narrow(0, 0, c), m1)) << "step " << step;
  }
  EXPECT_EQ(RandomStreams::row_seed(42, 0), 42U);
  EXPECT_NE(RandomStreams::row_seed(42, 1), RandomStreams::row_seed(42, 2));
}

TEST(RandomStreams, NormalValuesAreSeededFp32OnTheStreamsDevice) {
  RandomStreams a(RngMode::Shared, 7, 1, at::kCPU);
  RandomStreams b(RngMode::Shared, 7, 1, at::kCPU);
  RandomStreams other(RngMode::Shared, 8, 1, at::kCPU);
  const at::Tensor x = a.normal({1, 4, 64});
  EXPECT_EQ(x.sizes(), (std::vector<std::int64_t>{1, 4, 64}));
  EXPECT_EQ(x.scalar_type(), at::kFloat);
  EXPECT_TRUE(x.device().is_cpu());
  EXPECT_TRUE(at::equal(x, b.normal({1, 4, 64})));
  EXPECT_FALSE(at::equal(x, other.normal({1, 4, 64})));
  EXPECT_FALSE(at::equal(x, a.normal({1, 4, 64})));  // the stream moves on
  EXPECT_NEAR(a.normal({4096}).std().item<double>(), 1.0, 0.1);
}

TEST(RandomStreams, SharedStreamMakesRowZeroDependOnBatchSize) {
  const std::int64_t v = 1000;
  const std::int64_t c = 16;
  RandomStreams one(RngMode::Shared, 42, 1, at::kCPU);
  RandomStreams four(RngMode::Shared, 42, 4, at::kCPU);
  const at::Tensor probs1 = at::softmax(at::randn({c, v}), -1);
  (void)one.randint(v, c);
  (void)four.randint(v, c);
  (void)one.multinomial(probs1);
  (void)four.multinomial(probs1.repeat({4, 1}));
  // After the batch-4 run consumed draws for rows 1..3, row 0's next numbers differ.
  EXPECT_FALSE(at::equal(four.randint(v, c)[0], one.randint(v, c)[0]));
}

TEST(StableConfidentStopping, NeedsARepeatedArgmaxAndLowEntropy) {
  StableConfidentStopping stop(1, 0.005);
  const at::Tensor argmax = at::tensor({3L, 1L, 2L}).view({1, 3});
  at::Tensor sharp = at::zeros({1, 3, 5});
  sharp.index_put_({0, at::indexing::Slice(), 0}, 100.0);  // entropy ~ 0
  EXPECT_FALSE(stop(argmax, sharp).item<bool>());          // history starts at -1: never at step 1
  EXPECT_TRUE(stop(argmax, sharp).item<bool>());           // stable and confident
  const at::Tensor flat = at::zeros({1, 3, 5});
  EXPECT_FALSE(stop(argmax, flat).item<bool>());       // stable, not confident
  EXPECT_FALSE(stop(argmax + 1, sharp).item<bool>());  // confident, not stable
  stop.reset();
  EXPECT_FALSE(stop(argmax + 1, sharp).item<bool>());  // history forgotten
}

// The sampler's entropy, passed in, decides as the criterion's own pass over the logits does;
// the entropy given is what counts (the logits are not read again).
TEST(StableConfidentStopping, TakesTheSamplersEntropy) {
  at::manual_seed(7);
  const at::Tensor argmax = at::tensor({3L, 1L, 2L, 0L}).view({2, 2});
  at::Tensor logits = at::randn({2, 2, 6}) * 8.0;                   // [B, C, V]
  const at::Tensor entropy = token_entropy(logits);                 // [B, C]
  const double threshold = entropy.mean(-1).mean().item<double>();  // between the two rows
  StableConfidentStopping own(0, threshold);
  StableConfidentStopping given(0, threshold);
  const at::Tensor a = own(argmax, logits);
  const at::Tensor b = given(argmax, logits, entropy);
  EXPECT_TRUE(at::equal(a, b));
  EXPECT_NE(a[0].item<bool>(), a[1].item<bool>()) << entropy;
  StableConfidentStopping zero(0, threshold);
  EXPECT_TRUE(zero(argmax, logits, at::zeros_like(entropy)).all().item<bool>());
}

}  // namespace
}  // namespace batchlens::generation
