// SPDX-License-Identifier: Apache-2.0
#include "core/kernels/cpu_gemm.h"

#include <cmath>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "core/compat/torch_compat.h"
#include "tests/core/kernels/aten_bf16_gemm.h"

namespace batchlens::kernels {
namespace {

at::Tensor bf16_normal(std::vector<std::int64_t> shape, std::uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::normal(0.0, 1.0, shape, gen).to(at::kBFloat16);
}

std::int64_t bits_differing(const at::Tensor& a, const at::Tensor& b) {
  return (a.contiguous().view(at::kShort) != b.contiguous().view(at::kShort)).sum().item<long>();
}

TEST(CpuGemm, MatchesAtensOwnKernelBitwise) {
  const testing::AtenBf16Gemm aten;  // LibTorch computes bf16 matmuls itself while it lives
  const CpuGemmCheck check = check_cpu_gemm({2, 7, 128, 300});
#if !BL_TORCH_AT_LEAST(2, 0)
  ASSERT_TRUE(check.use) << check.report;
#else
  if (!check.use) {
    GTEST_SKIP() << "LibTorch 2's CPU GEMM is not the 1.13 kernel this reproduces: "
                 << check.report;
  }
#endif
  std::uint64_t seed = 1;
  for (const std::int64_t m : {1, 2, 5, 17, 64}) {
    for (const std::int64_t k : {2, 7, 128, 300}) {
      for (const std::int64_t n : {2, 15, 16, 17, 40}) {
        const at::Tensor x = bf16_normal({m, k}, seed++);
        const at::Tensor w = bf16_normal({n, k}, seed++);                       // transa layout
        const at::Tensor wt = bf16_normal({k, n}, seed++).t();                  // notrans layout
        const at::Tensor x3 = bf16_normal({2, m, k}, seed++);                   // [B, S, K]
        const at::Tensor xs = bf16_normal({m, k + 3}, seed++).narrow(1, 2, k);  // strided rows
        for (const at::Tensor& ww : {w, wt}) {
          for (const at::Tensor& xx : {x, x3, xs}) {
            ASSERT_TRUE(cpu_linear_bf16_covers(xx, ww));
            const at::Tensor got = cpu_linear_bf16(xx, ww, check.fma);
            ASSERT_EQ(got.sizes(), at::linear(xx, ww).sizes());
            EXPECT_EQ(bits_differing(got, at::linear(xx, ww)), 0)
                << "M=" << m << " K=" << k << " N=" << n << " w strides " << ww.strides() << " x "
                << xx.sizes();
          }
        }
      }
    }
  }
}

TEST(CpuGemm, CarriesNanAndInfinityAsAtenDoes) {
  const testing::AtenBf16Gemm aten;
  const CpuGemmCheck check = check_cpu_gemm({64});
  if (!check.use) {
    GTEST_SKIP() << check.report;
  }
  at::Tensor x = bf16_normal({6, 64}, 7);
  at::Tensor b = bf16_normal({64, 33}, 8);
  x.index_put_({1, 3}, NAN);
  x.index_put_({2, 0}, INFINITY);
  b.index_put_({5, 4}, -INFINITY);
  b.index_put_({9, 20}, 3e38);  // products overflow to infinity
  for (const at::Tensor& w : {b.t(), b.t().contiguous()}) {
    EXPECT_EQ(bits_differing(cpu_linear_bf16(x, w, check.fma), at::linear(x, w)), 0) << w.strides();
  }
}

// Large weights are packed once and reused; a weight written in place, or freed and its memory
// reused by another, is packed again.
TEST(CpuGemm, ReusesAPackOnlyWhileTheWeightIsUnchanged) {
  const testing::AtenBf16Gemm aten;
  const CpuGemmCheck check = check_cpu_gemm({256});
  if (!check.use) {
    GTEST_SKIP() << check.report;
  }
  const at::Tensor x = bf16_normal({9, 256}, 11);
  at::Tensor w = bf16_normal({96, 256}, 12);  // 96 x 256: packed and cached
  EXPECT_EQ(bits_differing(cpu_linear_bf16(x, w, check.fma), at::linear(x, w)), 0);
  EXPECT_EQ(bits_differing(cpu_linear_bf16(x, w, check.fma), at::linear(x, w)), 0);
  w.mul_(-3.0);  // in place: same storage and address, a new version
  EXPECT_EQ(bits_differing(cpu_linear_bf16(x, w, check.fma), at::linear(x, w)), 0);
  for (std::uint64_t seed = 20; seed < 24; ++seed) {  // fresh weights, often at the freed address
    w = bf16_normal({96, 256}, seed);
    EXPECT_EQ(bits_differing(cpu_linear_bf16(x, w, check.fma), at::linear(x, w)), 0) << seed;
  }
}

TEST(CpuGemm, CoversOnlyTheLayoutsItReproduces) {
  const at::Tensor x = bf16_normal({4, 8}, 1);
  const at::Tensor w = bf16_normal({6, 8}, 2);
  EXPECT_TRUE(cpu_linear_bf16_covers(x, w));
  EXPECT_TRUE(cpu_linear_bf16_covers(x, bf16_normal({8, 6}, 3).t()));
  EXPECT_FALSE(cpu_linear_bf16_covers(x.to(at::kFloat), w.to(at::kFloat)));    // fp32: BLAS's
  EXPECT_FALSE(cpu_linear_bf16_covers(x[0], w));                               // 1-D: a gemv
  EXPECT_FALSE(cpu_linear_bf16_covers(x, w.narrow(0, 0, 1)));                  // N = 1
  EXPECT_FALSE(cpu_linear_bf16_covers(x.narrow(1, 0, 1), w.narrow(1, 0, 1)));  // K = 1
  EXPECT_FALSE(cpu_linear_bf16_covers(bf16_normal({8, 4}, 4).t(), w));  // x not unit-stride in K
  EXPECT_FALSE(cpu_linear_bf16_covers(bf16_normal({3, 4, 8}, 5).transpose(0, 1), w));
  EXPECT_FALSE(cpu_linear_bf16_covers(
      x, bf16_normal({12, 16}, 6).slice(0, 0, 12, 2).slice(1, 0, 16, 2)));  // no unit stride at all
  EXPECT_FALSE(cpu_linear_bf16_covers(x, bf16_normal({6, 9}, 7)));          // K mismatch
}

TEST(CpuGemm, CheckReportsWhatItDecided) {
  const testing::AtenBf16Gemm aten;
  const CpuGemmCheck check = check_cpu_gemm({16, 4096});
  EXPECT_NE(check.report.find("CPU bf16 GEMM"), std::string::npos) << check.report;
  if (check.use) {
    EXPECT_NE(check.report.find("K = 2 8 16 512 2048 4096"), std::string::npos) << check.report;
  }
}

}  // namespace
}  // namespace batchlens::kernels
