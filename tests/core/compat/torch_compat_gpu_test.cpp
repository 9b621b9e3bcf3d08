// SPDX-License-Identifier: Apache-2.0
// GPU tests (label gpu): run on the H200 machine by scripts/gpu-build.sh, never in CI.
#include <set>
#include <vector>

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

// The side starts after the work queued before the branch (it reads a product the current
// stream has not finished when the host forks), the current stream waits for the side at
// the join, and both run at once: eager, under the profiler (two streams, overlapping
// kernels) and captured in a graph that is replayed on new inputs.
TEST(SideBranchGpu, TheSideStartsAfterTheForkAndTheJoinWaitsForIt) {
  ASSERT_TRUE(at::hasCUDA());
  const at::Device cuda(at::kCUDA, 0);
  const auto opts = at::TensorOptions().device(cuda).dtype(at::kFloat);
  at::manual_seed(7);
  const at::Tensor a = at::randn({2048, 2048}, opts).div_(64);
  at::Tensor in = at::randn({2048, 2048}, opts);
  const auto work = [&](at::Tensor& side_out, at::Tensor& main_out) {
    at::Tensor x = in;
    for (int i = 0; i < 8; ++i) {
      x = at::mm(x, a);  // still queued when the host forks
    }
    SideBranch branch(cuda, true);
    EXPECT_TRUE(branch.active());
    branch.run([&] {
      at::Tensor y = x;
      for (int i = 0; i < 8; ++i) {
        y = at::mm(y, a);
      }
      side_out = y;
    });
    at::Tensor z = x;
    for (int i = 0; i < 8; ++i) {
      z = at::mm(a, z);
    }
    branch.join({side_out});
    main_out = side_out + z;  // reads the side's result on the current stream
  };
  const auto expected = [&] {
    at::Tensor x = in;
    for (int i = 0; i < 8; ++i) {
      x = at::mm(x, a);
    }
    at::Tensor y = x;
    at::Tensor z = x;
    for (int i = 0; i < 8; ++i) {
      y = at::mm(y, a);
      z = at::mm(a, z);
    }
    return y + z;
  };
  at::Tensor side_out;
  at::Tensor out;
  work(side_out, out);
  EXPECT_TRUE(at::equal(out, expected()));

  std::vector<DeviceKernel> seen;
  seen = profile_kernels([&] { work(side_out, out); }, "bl/");
  std::set<std::int64_t> streams;
  for (const DeviceKernel& k : seen) {
    streams.insert(k.stream);
  }
  EXPECT_EQ(streams.size(), 2U) << seen.size() << " kernels";
  bool overlap = false;
  for (const DeviceKernel& k : seen) {
    for (const DeviceKernel& o : seen) {
      overlap = overlap || (k.stream != o.stream && k.start_us < o.start_us + o.duration_us &&
                            o.start_us < k.start_us + k.duration_us);
    }
  }
  EXPECT_TRUE(overlap) << "no kernel of one stream ran while one of the other did";

  DeviceGraph graph;
  graph.capture(cuda, [&] { work(side_out, out); });
  in.copy_(at::randn({2048, 2048}, opts));
  graph.replay();
  const at::Tensor replayed = out.clone();
  EXPECT_TRUE(at::equal(replayed, expected()));

  SideBranch off(cuda, false);
  EXPECT_FALSE(off.active());
}

TEST(TorchCompatGpu, GroupedMmIsAvailableOnHopper) {
  ASSERT_TRUE(at::hasCUDA());
  EXPECT_EQ(BL_TORCH_HAS_GROUPED_MM, 1) << "LibTorch " << torch_version();
}

}  // namespace
}  // namespace batchlens::compat
