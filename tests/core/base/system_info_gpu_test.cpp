// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include "core/base/system_info.h"

namespace batchlens::base {
namespace {

TEST(SystemInfoGpu, ListsTheGpuWithDriverAndCublas) {
  const auto info = query_system_info();
  ASSERT_TRUE(info.ok()) << info.error().message;
  const SystemInfo& s = info.value();
  EXPECT_TRUE(s.cuda_build);
  ASSERT_FALSE(s.gpus.empty());
  EXPECT_FALSE(s.gpus[0].name.empty());
  EXPECT_GT(s.gpus[0].total_memory, 0);
  EXPECT_GT(s.cuda_driver_version, 0);
  EXPECT_GT(s.cuda_runtime_version, 0);
  EXPECT_FALSE(s.cublas_version.empty());
  EXPECT_FALSE(s.gpu_driver.empty());
  EXPECT_NE(s.gpu_driver.find('.'), std::string::npos) << s.gpu_driver;
}

}  // namespace
}  // namespace batchlens::base
