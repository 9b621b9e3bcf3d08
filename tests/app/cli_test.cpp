// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of the batchlens-cli binary.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include "core/analysis/story.h"
#include "core/base/version.h"
#include "core/experiment/command_line.h"
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
  for (const char* variable : {"BATCHLENS_CUDA_GRAPHS", "BATCHLENS_FUSED_OFF",
                               "BATCHLENS_THREAD_CHOICE", "BATCHLENS_BI_PLAN", "BATCHLENS_TRACE"}) {
    EXPECT_NE(r.out.find(variable), std::string::npos) << variable << "\n" << r.out;
  }
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

// issue #37: cost --profile on a CPU prints its table and says why there is no profile; the
// culprit's --horizon-ticks is checked as typed.
TEST(Cli, CostProfileOnACpuSaysWhyAndCulpritHorizonIsChecked) {
  const auto r = run_process({BL_CLI_PATH, "cost", "--preset", "tiny", "--batch-sizes", "1",
                              "--repeat", "2", "--profile", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_NE(j.at("profile_note").get<std::string>().find("device kernels"), std::string::npos);
  EXPECT_TRUE(j.at("policies").at(0).at("cells").at(0).at("profile").is_null());
  const auto bad = run_process({BL_CLI_PATH, "culprit", "--preset", "tiny", "--horizon-ticks", "-2",
                                "--out", "/tmp/never-written.h5"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("horizon-ticks"), std::string::npos) << bad.err;
}

// issue #37: BATCHLENS_TRACE where it cannot be honoured (a build without a kernel profiler, or
// kernel provenance on, which profiles too) is refused before any work: exit 1, the reason,
// neither the trace nor the experiment file written.
TEST(Cli, TraceSwitchIsRefusedBeforeAnyWorkWhereItCannotBeHonoured) {
  const std::string base = "/tmp/bl_cli_trace_" + std::to_string(::getpid());
  for (const bool kernels : {true, false}) {
    std::vector<std::string> argv = {"/usr/bin/env", "BATCHLENS_TRACE=" + base + ".json",
                                     BL_CLI_PATH,    "run",
                                     "--preset",     "tiny",
                                     "--steps",      "2",
                                     "--out",        base + ".h5"};
    if (!kernels) {
      argv.emplace_back("--no-kernels");
    }
    const auto r = run_process(argv);
    if (r.exit_code == 0) {
      // A CUDA build with the profiler traces a run without kernel provenance.
      ASSERT_FALSE(kernels) << r.err;
      EXPECT_TRUE(std::ifstream(base + ".json").good());
    } else {
      EXPECT_EQ(r.exit_code, 1) << r.err;
      EXPECT_NE(r.err.find("BATCHLENS_TRACE"), std::string::npos) << r.err;
      EXPECT_NE(r.err.find(kernels ? "profil" : "no kernel profiler"), std::string::npos) << r.err;
      EXPECT_FALSE(std::ifstream(base + ".json").good());
      EXPECT_FALSE(std::ifstream(base + ".h5").good());
    }
    std::remove((base + ".json").c_str());
    std::remove((base + ".h5").c_str());
  }
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

// issue #32: a run's text and a first divergence's tap name holding bytes that are not UTF-8
// (another person's file) give JSON with U+FFFD in their place, not "internal error".
// `batchlens-cli run` of the tiny preset, B=1 vs B=2, 2 steps and 8 tokens, into `out`.
void run_tiny(const ops::OpPolicy& policy, const std::string& out) {
  experiment::ExperimentSpec spec;
  spec.model.preset = "tiny";
  spec.batch_sizes = {2};
  spec.repeats = 0;
  spec.overrides.max_denoising_steps = 2;
  spec.overrides.max_new_tokens = 8;
  spec.policy = policy;
  std::string command = experiment::cli_run_command(spec, {}, out);
  command.replace(0, std::string("batchlens-cli").size(), BL_CLI_PATH);
  ASSERT_EQ(run_process({"/bin/sh", "-c", command}).exit_code, 0) << command;
}

TEST(Cli, SummaryJsonReplacesInvalidUtf8FromTheFile) {
  const std::string base = ::testing::TempDir() + "/bl_cli_utf8_" + std::to_string(::getpid());
  ASSERT_NO_FATAL_FAILURE(
      run_tiny(ops::OpPolicy::emulation_profile("emulated_h200"), base + ".h5"));
  auto file = io::read_experiment(base + ".h5");
  ASSERT_TRUE(file.ok()) << file.error().message;
  experiment::ExperimentResult r = std::move(file).value();
  ASSERT_FALSE(r.runs.empty());
  ASSERT_FALSE(r.comparisons.empty());
  r.runs[0].text = "caf\xC3 \xFF\xFE end";
  r.comparisons[0].first.tap = "layer\xC0.out";
  ASSERT_TRUE(io::write_experiment(base + "-bad.h5", r).ok());
  const auto plain = run_process({BL_CLI_PATH, "summary", base + "-bad.h5"});
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  const auto json = run_process({BL_CLI_PATH, "summary", base + "-bad.h5", "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_EQ(json.err.find("internal error"), std::string::npos) << json.err;
  const auto doc = nlohmann::json::parse(json.out, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << json.out;
  EXPECT_NE(json.out.find("\xEF\xBF\xBD"), std::string::npos);  // U+FFFD
  std::remove((base + ".h5").c_str());
  std::remove((base + "-bad.h5").c_str());
}

// issue #34: a file whose metadata fails HDF5's checksums (bytes flipped all through it) is
// refused with its reason, and HDF5 has nothing left to complain about at exit (it printed
// "HDF5: infinite loop closing library" while an automatic error report was set).
TEST(Cli, AFileThatFailsHdf5ChecksumsLeavesNothingOpenAtExit) {
  const std::string base = ::testing::TempDir() + "/bl_cli_checksum_" + std::to_string(::getpid());
  ASSERT_NO_FATAL_FAILURE(run_tiny(ops::OpPolicy::default_policy(), base + ".h5"));
  std::string bytes;
  {
    std::ifstream in(base + ".h5", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_GT(bytes.size(), 4096U);
  for (std::size_t i = 512; i < bytes.size(); i += 97) {
    bytes[i] = static_cast<char>(bytes[i] ^ 0x5A);
  }
  std::ofstream(base + "-bad.h5", std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  const std::vector<std::vector<std::string>> commands = {
      {BL_CLI_PATH, "summary", base + "-bad.h5"},
      {BL_CLI_PATH, "repro", base + "-bad.h5", "--out", base + "-repro"}};
  for (const auto& command_line : commands) {
    const std::string& what = command_line[1];
    const auto r = run_process(command_line);
    EXPECT_EQ(r.exit_code, 1) << what << ": " << r.err;
    EXPECT_NE(r.err.find("-bad.h5"), std::string::npos) << what << ": " << r.err;
    EXPECT_EQ(r.err.find("infinite loop"), std::string::npos) << what << ": " << r.err;
    EXPECT_EQ(r.err.find("HDF5-DIAG"), std::string::npos) << what << ": " << r.err;
  }
  std::remove((base + ".h5").c_str());
  std::remove((base + "-bad.h5").c_str());
}

// issue #18: `repro` on an experiment file writes the folder; bad sizes and files are refused.
TEST(Cli, ReproExportsTheFirstDivergentOpOfAFile) {
  experiment::ExperimentSpec spec;
  spec.model.preset = "demo";
  spec.seed = 5;
  spec.batch_sizes = {2};
  spec.repeats = 0;
  spec.overrides.max_denoising_steps = 4;
  spec.overrides.max_new_tokens = 32;
  spec.policy = ops::OpPolicy::emulation_profile("emulated_h200");
  const std::string base = ::testing::TempDir() + "/bl_cli_repro_" + std::to_string(::getpid());
  const std::string file = base + ".h5";
  std::string command = experiment::cli_run_command(spec, {}, file);
  command.replace(0, std::string("batchlens-cli").size(), BL_CLI_PATH);
  ASSERT_EQ(run_process({"/bin/sh", "-c", command}).exit_code, 0) << command;

  const auto r = run_process({BL_CLI_PATH, "repro", file, "--out", base + "-repro"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("repro: selfcond_matmul (matmul"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("row 0 DIFFERS"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("python3 repro.py --emulate"), std::string::npos) << r.out;
  const auto bad_size =
      run_process({BL_CLI_PATH, "repro", file, "--out", base + "-x", "--max-bytes", "12XB"});
  EXPECT_EQ(bad_size.exit_code, 2) << bad_size.err;
  EXPECT_NE(bad_size.err.find("is not a size"), std::string::npos) << bad_size.err;
  const auto missing = run_process({BL_CLI_PATH, "repro", base + "-none.h5", "--out", base + "-y"});
  EXPECT_EQ(missing.exit_code, 1) << missing.err;
  const auto no_op = run_process(
      {BL_CLI_PATH, "repro", file, "--out", base + "-z", "--op", "nope", "--step", "2"});
  EXPECT_EQ(no_op.exit_code, 1);
  EXPECT_NE(no_op.err.find("unknown op family"), std::string::npos) << no_op.err;
  const auto help = run_process({BL_CLI_PATH, "repro", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--max-bytes"), std::string::npos);
  std::remove(file.c_str());
  run_process({"/bin/rm", "-rf", base + "-repro"});
}

}  // namespace
}  // namespace batchlens
