// SPDX-License-Identifier: Apache-2.0
#include "core/compat/torch_compat.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "core/compat/device_graph.h"

namespace batchlens::compat {
namespace {

// Attention computed independently in fp64, one (batch, head) slice at a time.
at::Tensor reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& mask, double scale) {
  const auto qd = q.to(at::kDouble);
  const auto kd = k.to(at::kDouble);
  const auto vd = v.to(at::kDouble);
  const int64_t groups = q.size(1) / k.size(1);
  auto out = at::zeros({q.size(0), q.size(1), q.size(2), v.size(3)}, at::kDouble);
  for (int64_t b = 0; b < q.size(0); ++b) {
    for (int64_t h = 0; h < q.size(1); ++h) {
      const int64_t kvh = h / groups;
      auto s = at::mm(qd[b][h], kd[b][kvh].t()) * scale;  // [Sq, Sk]
      if (mask.defined()) {
        s = s.masked_fill(mask.logical_not(), -1e300);
      }
      out[b][h] = at::mm(at::softmax(s, -1), vd[b][kvh]);
    }
  }
  return out;
}

TEST(TorchCompat, VersionGuardsAgreeWithHeaders) {
  EXPECT_EQ(torch_version(), TORCH_VERSION);
  EXPECT_TRUE(BL_TORCH_AT_LEAST(1, 13));
  EXPECT_FALSE(BL_TORCH_AT_LEAST(99, 0));
#if TORCH_VERSION_MAJOR < 2
  EXPECT_EQ(sdpa_backend(), SdpaBackend::Math);
  EXPECT_EQ(BL_TORCH_HAS_GROUPED_MM, 0);
#endif
}

TEST(TorchCompat, RepeatKvRepeatsEachHeadConsecutively) {
  const auto x = at::arange(2 * 3 * 1 * 1, at::kFloat).reshape({2, 3, 1, 1});
  const auto y = repeat_kv(x, 2);
  ASSERT_EQ(y.sizes(), (at::IntArrayRef{2, 6, 1, 1}));
  EXPECT_TRUE(at::equal(y, at::repeat_interleave(x, 2, 1)));
}

TEST(TorchCompat, SdpaMatchesIndependentAttentionWithGqaAndMask) {
  at::manual_seed(7);
  const auto q = at::randn({2, 4, 5, 8});
  const auto k = at::randn({2, 2, 7, 8});
  const auto v = at::randn({2, 2, 7, 8});
  const auto mask = at::rand({5, 7}) > 0.3;  // [Sq, Sk], bool, true = attend
  mask.select(1, 0).fill_(true);             // every query sees at least one key
  const double scale = 1.0;                  // DiffusionGemma's attention scale

  const auto expected = reference_attention(q, k, v, mask, scale);
  const auto got = sdpa(q, k, v, mask, scale, /*is_causal=*/false, /*enable_gqa=*/true);
  EXPECT_TRUE(at::allclose(got.to(at::kDouble), expected, 1e-5, 1e-5))
      << (got.to(at::kDouble) - expected).abs().max().item<double>();
  const auto math = sdpa_math(q, k, v, at::Tensor(), 0.125, false, true);
  EXPECT_TRUE(
      at::allclose(math.to(at::kDouble), reference_attention(q, k, v, {}, 0.125), 1e-5, 1e-5));
}

TEST(TorchCompat, SdpaKeepsBf16AndAccumulatesInFp32) {
  at::manual_seed(11);
  const auto q = at::randn({1, 2, 4, 16}).to(at::kBFloat16);
  const auto k = at::randn({1, 1, 6, 16}).to(at::kBFloat16);
  const auto v = at::randn({1, 1, 6, 16}).to(at::kBFloat16);
  const auto got = sdpa(q, k, v, at::Tensor(), 1.0, false, true);
  EXPECT_EQ(got.scalar_type(), at::kBFloat16);
  const auto expected = reference_attention(q, k, v, {}, 1.0);
  // bf16 output rounding only: 2^-8 relative.
  EXPECT_TRUE(at::allclose(got.to(at::kDouble), expected, 1e-2, 1e-2));
}

TEST(TorchCompat, SdpaRejectsMismatchedHeads) {
  const auto q = at::randn({1, 3, 2, 4});
  const auto k = at::randn({1, 2, 2, 4});
  EXPECT_THROW((void)sdpa(q, k, k, at::Tensor(), 1.0, false, true), c10::Error);
  const auto q4 = at::randn({1, 4, 2, 4});
  // Fewer kv heads than query heads needs enable_gqa (callers repeat_kv otherwise).
  EXPECT_THROW((void)sdpa(q4, k, k, at::Tensor(), 1.0, false, false), c10::Error);
}

TEST(TorchCompat, CausalSdpaEqualsLowerTriangularMask) {
  at::manual_seed(5);
  const auto q = at::randn({1, 2, 6, 8});
  const auto k = at::randn({1, 2, 6, 8});
  const auto v = at::randn({1, 2, 6, 8});
  const auto tril = at::ones({6, 6}, at::kBool).tril();
  const auto causal = sdpa(q, k, v, at::Tensor(), 1.0, /*is_causal=*/true);
  const auto expected = reference_attention(q, k, v, tril, 1.0);
  EXPECT_TRUE(at::allclose(causal.to(at::kDouble), expected, 1e-5, 1e-5));
  // Position 0 sees only key 0: its output is v[0].
  EXPECT_TRUE(at::allclose(causal[0][0][0], v[0][0][0], 1e-6, 1e-6));
}

TEST(TorchCompat, SdpaMathGivesZerosToAQueryWithNoKeyAndChangesNoOtherBit) {
  // A padding token's query in a left-padded batch may attend to no key (issue #35): LibTorch
  // 2.5+'s math backend returns zeros there (_safe_softmax), not NaN.
  at::manual_seed(6);
  const auto q = at::randn({2, 2, 4, 8}).to(at::kBFloat16);
  const auto k = at::randn({2, 2, 5, 8}).to(at::kBFloat16);
  const auto v = at::randn({2, 2, 5, 8}).to(at::kBFloat16);
  auto mask = at::ones({2, 1, 4, 5}, at::kBool);
  mask[0][0][1].fill_(false);  // row 0, query 1: nothing to attend to
  const auto out = sdpa_math(q, k, v, mask, 1.0, false, false);
  EXPECT_TRUE(out.isfinite().all().item<bool>());
  EXPECT_TRUE(at::equal(out[0].select(1, 1), at::zeros_like(out[0].select(1, 1))));
  // Every other query: the bits of the call without that row masked.
  const auto plain = sdpa_math(q, k, v, at::ones({2, 1, 4, 5}, at::kBool), 1.0, false, false);
  EXPECT_TRUE(at::equal(out[1], plain[1]));
  EXPECT_TRUE(at::equal(out[0].select(1, 0), plain[0].select(1, 0)));
  EXPECT_TRUE(at::equal(out[0].narrow(1, 2, 2), plain[0].narrow(1, 2, 2)));
}

TEST(DeviceGraph, NeverSupportedOnTheCpu) {
  EXPECT_FALSE(DeviceGraph::supported(at::Device(at::kCPU)));
  DeviceGraph graph;
  EXPECT_FALSE(graph.captured());
  // Capture refuses a CPU device in every build, and nothing is left captured.
  EXPECT_THROW(graph.capture(at::Device(at::kCPU), [] {}), c10::Error);
  EXPECT_FALSE(graph.captured());
  EXPECT_THROW(graph.replay(), c10::Error);
}

TEST(SideBranch, RunsTheWorkInLineOnTheCpu) {
  SideBranch branch(at::Device(at::kCPU), true);
  EXPECT_FALSE(branch.active());
  int ran = 0;
  at::Tensor out;
  branch.run([&] {
    ++ran;
    out = at::ones({3}) * 2;
  });
  EXPECT_EQ(ran, 1);  // in line: done before run() returns
  branch.join({out});
  EXPECT_TRUE(at::equal(out, at::full({3}, 2.0F)));
}

}  // namespace
}  // namespace batchlens::compat
