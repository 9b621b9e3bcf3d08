// SPDX-License-Identifier: Apache-2.0
// GPU tests (label gpu) of the comparison metrics' CUDA kernel: run on the H200 machine by
// scripts/gpu-build.sh, never in CI.
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "core/kernels/fused_ops.h"
#include "core/probe/metrics.h"
#include "tests/support/diff_pairs.h"

namespace batchlens::probe {
namespace {

std::vector<at::Tensor> to_cuda(const std::vector<at::Tensor>& v) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : v) {
    out.push_back(t.to(at::kCUDA));
  }
  return out;
}

void expect_rows_equal(const at::Tensor& many, const std::vector<at::Tensor>& refs,
                       const std::vector<at::Tensor>& runs) {
  for (std::size_t i = 0; i < refs.size(); ++i) {
    const at::Tensor one = position_diff(refs[i], runs[i]).cpu();
    const at::Tensor row = many[static_cast<std::int64_t>(i)].cpu();
    EXPECT_TRUE(at::equal(row.view(at::kInt), one.view(at::kInt)))
        << "pair " << i << " (" << refs[i].scalar_type() << ", " << refs[i].sizes() << "): " << row
        << " vs " << one;
  }
}

TEST(MetricsGpu, KernelEqualsTheAtenDefinitionAndTheCpuPass) {
  if (!at::hasCUDA() || !kernels::built()) {
    GTEST_SKIP() << "no CUDA device or no fused kernels in this build";
  }
  const std::int64_t c = 37;
  const auto [refs, runs] = test::diff_pairs(c, {1, 6, 33, 1000, 4099}, 20);
  const auto cref = to_cuda(refs);
  const auto crun = to_cuda(runs);
  const at::Tensor gpu = position_diffs(cref, crun);
  ASSERT_TRUE(gpu.is_cuda());
  ASSERT_EQ(gpu.sizes(), (at::IntArrayRef{static_cast<std::int64_t>(refs.size()), 3, c}));
  expect_rows_equal(gpu, cref, crun);  // ATen's ops on the GPU
  EXPECT_TRUE(at::equal(gpu.cpu().view(at::kInt), position_diffs(refs, runs).view(at::kInt)));
}

TEST(MetricsGpu, LogitsSizedRowsAndNonContiguousViews) {
  if (!at::hasCUDA() || !kernels::built()) {
    GTEST_SKIP() << "no CUDA device or no fused kernels in this build";
  }
  // A logits tap [C, V] with V = 262144 (the model's vocabulary), and row 1 of a [B, C, H]
  // tensor (a view), and a transposed (non-contiguous) pair.
  at::manual_seed(5);
  const std::int64_t c = 16;
  const at::Tensor a = at::randn({c, 262144}, at::TensorOptions().device(at::kCUDA));
  at::Tensor b = a.clone();
  b.slice(1, 0, 262144, 1000).fill_(0.5F);
  const at::Tensor batch =
      at::randn({3, c, 2816}, at::TensorOptions().device(at::kCUDA)).to(at::kBFloat16);
  const at::Tensor t = at::randn({64, c}, at::TensorOptions().device(at::kCUDA)).t();
  const std::vector<at::Tensor> refs{a, batch.select(0, 0), t};
  const std::vector<at::Tensor> runs{b, batch.select(0, 2), (t * 2).t().t()};
  const at::Tensor gpu = position_diffs(refs, runs);
  expect_rows_equal(gpu, refs, runs);
  EXPECT_GT(gpu[0][0][0].item<float>(), 0.0F);
}

TEST(MetricsGpu, RowsOfBatchedTapsEqualTheCpuPass) {
  if (!at::hasCUDA() || !kernels::built()) {
    GTEST_SKIP() << "no CUDA device or no fused kernels in this build";
  }
  at::manual_seed(6);
  const at::Tensor a = at::randn({4, 33, 16, 32}).to(at::kBFloat16);
  at::Tensor b = a.clone();
  b[3].mul_(1.001);
  b[1][7][2][9] = -b[1][7][2][9];
  const at::Tensor ids = at::randint(0, 128, {4, 33, 8}, at::kLong);
  const at::Tensor logits = at::randn({4, 33, 300});
  std::vector<TapRow> refs;
  std::vector<TapRow> runs;
  for (std::int64_t r = 0; r < 4; ++r) {
    refs.push_back({a, 0});
    runs.push_back({b, r});
    refs.push_back({ids, 0});
    runs.push_back({ids, r});
    refs.push_back({logits, r});
    runs.push_back({logits, 3 - r});
  }
  std::vector<TapRow> crefs;
  std::vector<TapRow> cruns;
  for (std::size_t i = 0; i < refs.size(); ++i) {
    crefs.push_back({refs[i].tensor.to(at::kCUDA), refs[i].row});
    cruns.push_back({runs[i].tensor.to(at::kCUDA), runs[i].row});
  }
  const at::Tensor gpu = position_diffs(crefs, cruns).cpu();
  EXPECT_TRUE(at::equal(gpu.view(at::kInt), position_diffs(refs, runs).view(at::kInt)));
  EXPECT_GT(gpu.select(1, 0).sum().item<float>(), 0.0F);
}

TEST(MetricsGpu, MorePairsThanOneGridColumn) {
  if (!at::hasCUDA() || !kernels::built()) {
    GTEST_SKIP() << "no CUDA device or no fused kernels in this build";
  }
  // 70000 pairs: 584 launches of up to 120 pairs each (the pairs travel as kernel parameters).
  const at::Tensor a = at::randn({70000, 2, 3}, at::TensorOptions().device(at::kCUDA));
  at::Tensor b = a.clone();
  b.select(0, 69999).fill_(1.0F);
  std::vector<at::Tensor> refs;
  std::vector<at::Tensor> runs;
  for (std::int64_t i = 0; i < a.size(0); ++i) {
    refs.push_back(a[i]);
    runs.push_back(b[i]);
  }
  const at::Tensor gpu = position_diffs(refs, runs).cpu();  // [70000, 3, 2]
  EXPECT_EQ(gpu.select(1, 0).narrow(0, 0, 69999).sum().item<float>(), 0.0F);
  EXPECT_GT(gpu[69999][0][0].item<float>(), 0.0F);
  expect_rows_equal(gpu.narrow(0, 69990, 10),
                    std::vector<at::Tensor>(refs.begin() + 69990, refs.end()),
                    std::vector<at::Tensor>(runs.begin() + 69990, runs.end()));
}

}  // namespace
}  // namespace batchlens::probe
