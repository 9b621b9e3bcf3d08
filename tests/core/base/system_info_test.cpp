// SPDX-License-Identifier: Apache-2.0
#include "core/base/system_info.h"

#include <chrono>
#include <thread>

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/version.h>

#include "core/base/version.h"

namespace batchlens::base {
namespace {

TEST(SystemInfo, DescribesThisMachine) {
  const auto info = query_system_info();
  ASSERT_TRUE(info.ok()) << info.error().message;
  const SystemInfo& s = info.value();
  EXPECT_GT(s.hardware_threads, 0);
  EXPECT_GE(s.torch_threads, 1);
  EXPECT_EQ(s.libtorch_version, TORCH_VERSION);
  EXPECT_FALSE(s.host.empty());
  EXPECT_NE(s.blas, "");

  const std::string text = describe(s);
  EXPECT_NE(text.find(std::string("LibTorch ") + TORCH_VERSION), std::string::npos) << text;
  EXPECT_NE(text.find("CPU: "), std::string::npos) << text;
  EXPECT_NE(text.find("CUDA: "), std::string::npos) << text;
}

// The process's age counts from its exec (the CLI's time line, issue #37): positive, it grows with
// the wall clock, and a test binary is not a day old.
TEST(SystemInfo, SecondsSinceProcessStartFollowTheWallClock) {
  const double a = seconds_since_process_start();
  ASSERT_GE(a, 0.0) << "/proc/self/stat or CLOCK_BOOTTIME unreadable";
  EXPECT_LT(a, 24.0 * 3600.0);
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const double b = seconds_since_process_start();
  EXPECT_GE(b - a, 0.14);
  EXPECT_LT(b - a, 10.0);
}

TEST(SystemInfo, ConfigureThreadsSetsLibTorch) {
  const int before = at::get_num_threads();
  configure_threads(1);
  EXPECT_EQ(at::get_num_threads(), 1);
  configure_threads(0);  // one per hardware thread
  EXPECT_GE(at::get_num_threads(), 1);
  configure_threads(before);
}

TEST(BuildInfo, NamesVersionAndLibTorch) {
  const BuildInfo& b = build_info();
  EXPECT_FALSE(b.tool_version.empty());
  EXPECT_EQ(b.libtorch_version, TORCH_VERSION);
  EXPECT_FALSE(b.git_hash.empty());
}

}  // namespace
}  // namespace batchlens::base
