// SPDX-License-Identifier: Apache-2.0
// GPU tests (label gpu): run on the H200 machine by scripts/gpu-build.sh, never in CI.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "core/compat/torch_compat.h"

namespace batchlens::compat {
namespace {

TEST(TorchCompatGpu, NativeSdpaMatchesMathPathOnCuda) {
  ASSERT_TRUE(at::hasCUDA()) << "gpu tests need a CUDA device";
  at::manual_seed(3);
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const auto q = at::randn({2, 16, 256, 256}, opts);
  const auto k = at::randn({2, 8, 300, 256}, opts);
  const auto v = at::randn({2, 8, 300, 256}, opts);
  const auto native = sdpa(q, k, v, at::Tensor(), 1.0 / 16.0, false, true);
  const auto math = sdpa_math(q, k, v, at::Tensor(), 1.0 / 16.0, false, true);
  ASSERT_EQ(native.sizes(), math.sizes());
  EXPECT_EQ(native.scalar_type(), at::kBFloat16);
  const double diff = (native.to(at::kFloat) - math.to(at::kFloat)).abs().max().item<double>();
  EXPECT_LT(diff, 2e-2) << "max |native - math| = " << diff;
}

TEST(TorchCompatGpu, GroupedMmIsAvailableOnHopper) {
  ASSERT_TRUE(at::hasCUDA());
  EXPECT_EQ(BL_TORCH_HAS_GROUPED_MM, 1) << "LibTorch " << torch_version();
}

}  // namespace
}  // namespace batchlens::compat
