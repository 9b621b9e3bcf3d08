// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of the batchlens-cli binary.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include "core/base/version.h"
#include "tests/support/process.h"

namespace batchlens {
namespace {

using testing::run_process;

TEST(Cli, VersionNamesToolLibTorchAndDevices) {
  const auto r = run_process({BL_CLI_PATH, "--version"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("BatchLens " + base::build_info().tool_version), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(std::string("LibTorch ") + TORCH_VERSION), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("hardware threads"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("CUDA: "), std::string::npos) << r.out;
}

TEST(Cli, HelpListsCommandsAndExitsZero) {
  const auto r = run_process({BL_CLI_PATH, "--help"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("info"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--version"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Exit codes:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("143 SIGTERM"), std::string::npos) << r.out;
}

TEST(Cli, UsageErrorsExitTwo) {
  const auto r = run_process({BL_CLI_PATH, "--no-such-flag"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no-such-flag"), std::string::npos) << r.err;
  EXPECT_EQ(run_process({BL_CLI_PATH, "no-such-command"}).exit_code, 2);
}

TEST(Cli, InfoJsonIsMachineReadable) {
  const auto r = run_process({BL_CLI_PATH, "info", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("libtorch").get<std::string>(), TORCH_VERSION);
  EXPECT_GT(j.at("cpu").at("hardware_threads").get<int>(), 0);
  EXPECT_TRUE(j.at("cuda").at("gpus").is_array());
  EXPECT_EQ(j.at("batchlens").at("version").get<std::string>(), base::build_info().tool_version);
}

}  // namespace
}  // namespace batchlens
