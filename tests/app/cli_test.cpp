// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of the batchlens-cli binary.
#include <cstdio>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include "core/base/version.h"
#include "core/experiment/command_line.h"
#include "core/experiment/story.h"
#include "core/io/experiment_file.h"
#include "tests/support/process.h"

#include <unistd.h>

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

// issue #16: the report's "Reproduce" command, run by a shell, runs the same experiment.
TEST(Cli, ReproduceCommandOfASpecRunsThatSpec) {
  experiment::ExperimentSpec spec;
  spec.model.preset = "tiny";
  spec.model.seed = 3;
  spec.prompt = "It's \"quoted\"; $HOME `x` \\ done";
  spec.seed = 7;
  spec.batch_sizes = {2};
  spec.repeats = 0;
  spec.overrides.max_denoising_steps = 2;
  spec.overrides.max_new_tokens = 8;
  spec.mode = experiment::RunMode::Lockstep;
  spec.policy = ops::OpPolicy::emulation_profile("emulated_h200");
  spec.workaround = ops::OpPolicy::issue_workaround();
  spec.taps = {"router.scores", "logits"};
  const std::string out = ::testing::TempDir() + "/bl_repro_" + std::to_string(::getpid()) + ".h5";
  std::string command = experiment::cli_run_command(spec, {}, out);
  ASSERT_EQ(command.rfind("batchlens-cli run ", 0), 0U) << command;
  command.replace(0, std::string("batchlens-cli").size(), BL_CLI_PATH);
  const auto r = run_process({"/bin/sh", "-c", command});
  ASSERT_EQ(r.exit_code, 0) << command << "\n" << r.err;
  const auto file = io::read_experiment(out);
  ASSERT_TRUE(file.ok()) << file.error().message;
  EXPECT_EQ(experiment::to_json(file.value().spec), experiment::to_json(spec));
  std::remove(out.c_str());
}

}  // namespace
}  // namespace batchlens
