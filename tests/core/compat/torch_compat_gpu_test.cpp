// SPDX-License-Identifier: Apache-2.0
// GPU tests (label gpu): run on the H200 machine by scripts/gpu-build.sh, never in CI.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "core/compat/device_graph.h"
#include "core/compat/profile.h"
#include "core/compat/torch_compat.h"

namespace batchlens::compat {
namespace {

// A pass that syncs (nonzero, as the eager expert loop does) cannot be captured; the failed
// capture must end the capture, or every later CUDA call of the process fails with "operation
// not permitted when stream is capturing" (run/generate on the H200 stopped so).
TEST(DeviceGraphGpu, AFailedCaptureLeavesCudaUsable) {
  const at::Device cuda(at::kCUDA, 0);
  const at::Tensor x = at::arange(8, at::TensorOptions().device(cuda).dtype(at::kFloat));
  compat::DeviceGraph graph;
  EXPECT_ANY_THROW(graph.capture(cuda, [&] { (void)at::nonzero(x > 3); }));
  EXPECT_FALSE(graph.captured());
  EXPECT_EQ(at::nonzero(x > 3).size(0), 4);
  EXPECT_EQ((x * 2).sum().item<float>(), 56.0F);
  // And a capture that can succeed still does, and replays.
  at::Tensor y;
  graph.capture(cuda, [&] { y = x * 3; });
  graph.replay();
  EXPECT_EQ(y.sum().item<float>(), 84.0F);
}

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

// Work that leaves the device far behind the host (large GEMMs launched without a wait) still
// shows every kernel: the profile of the 26B-A4B pass at B=4 once lost its last layers so.
TEST(ProfilerGpu, KernelsStillQueuedWhenTheWorkReturnsAreInTheProfile) {
  ASSERT_TRUE(at::hasCUDA());
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  const at::Tensor a = at::randn({4096, 4096}, opts);
  constexpr int kLaunches = 64;
  static const std::string scope_name = "bl/test/0";
  const std::vector<DeviceKernel> seen = profile_kernels(
      [&] {
        const ProfilerScope scope(&scope_name);
        at::Tensor x = a;
        for (int i = 0; i < kLaunches; ++i) {
          x = at::mm(x, a);  // ~1 ms each: the host is done long before the device
        }
      },
      "bl/");
  int in_scope = 0;
  for (const DeviceKernel& k : seen) {
    in_scope += k.scope == scope_name && k.duration_us > 0.0 ? 1 : 0;
  }
  EXPECT_GE(in_scope, kLaunches) << seen.size() << " kernels seen";
}

TEST(TorchCompatGpu, GroupedMmIsAvailableOnHopper) {
  ASSERT_TRUE(at::hasCUDA());
  EXPECT_EQ(BL_TORCH_HAS_GROUPED_MM, 1) << "LibTorch " << torch_version();
}

}  // namespace
}  // namespace batchlens::compat
