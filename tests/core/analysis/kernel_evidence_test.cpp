// SPDX-License-Identifier: Apache-2.0
#include "core/analysis/kernel_evidence.h"

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/analysis/summary.h"
#include "core/experiment/experiment.h"
#include "core/experiment/kernel_provenance.h"
#include "core/experiment/runner.h"
#include "core/io/experiment_file.h"
#include "core/setup/front_door.h"

#include <unistd.h>

namespace batchlens::experiment {
namespace {

using namespace batchlens::analysis;  // NOLINT(google-build-using-namespace): the units under test

namespace fs = std::filesystem;

// The demo preset, one canvas of 32 tokens, 4 steps, B=1 against B=2.
ExperimentSpec evidence_spec(const std::string& policy, bool kernels) {
  ExperimentSpec s;
  s.model.preset = "demo";
  s.seed = 5;
  s.overrides.max_denoising_steps = 4;
  s.overrides.max_new_tokens = 32;
  s.batch_sizes = {2};
  s.repeats = 1;
  s.policy = ops::policy_from_text(policy).value();
  s.kernels = kernels;
  return s;
}

const setup::Session& evidence_session() {
  static const setup::Session s = [] {
    auto opened = open_session_for(evidence_spec("default", false));
    EXPECT_TRUE(opened.ok()) << (opened.ok() ? "" : opened.error().message);
    return std::move(opened).value();
  }();
  return s;
}

ExperimentResult run(const ExperimentSpec& spec) {
  auto r = run_experiment(evidence_session(), spec);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? std::move(r).value() : ExperimentResult{};
}

// On a CPU the record is the op layer's path: under the emulation the self-conditioning
// matmul's K split differs between B=1 and B=2, which is the divergence's cause.
TEST(Kernels, CpuRecordNamesThePathAndTheSplitThatDiffers) {
  const ExperimentResult r = run(evidence_spec("emulated_h200", true));
  ASSERT_TRUE(r.kernels.has_value());
  // ref and b2 (the repeat is the reference's engine again), each without and with SC.
  EXPECT_EQ(r.kernels->engines.size(), 4U);
  const EngineKernels* ref = r.kernels->engine("ref", true);
  const EngineKernels* b2 = r.kernels->engine("b2", true);
  ASSERT_NE(ref, nullptr);
  ASSERT_NE(b2, nullptr);
  EXPECT_EQ(b2->batch_size, 2);
  const OpKernels* a = find_op(*ref, "selfcond_matmul", -1);
  const OpKernels* b = find_op(*b2, "selfcond_matmul", -1);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->path, "emulated split-K: 4 K-chunks");  // M = 32 rows
  EXPECT_EQ(b->path, "emulated split-K: 2 K-chunks");  // M = 64 rows
  EXPECT_EQ(a->m, 32);
  EXPECT_EQ(b->m, 64);
  EXPECT_EQ(a->k, 4096);  // the demo vocabulary
  // Without self-conditioning the pass has no self-conditioning matmul.
  EXPECT_EQ(find_op(*r.kernels->engine("ref", false), "selfcond_matmul", -1), nullptr);
  // Every layer's projections are there, with the library behind ATen's calls named.
  const OpKernels* q = find_op(*ref, "q_proj", 0);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->path.rfind("at::linear → ", 0) == 0 || q->path.rfind("BatchLens CPU GEMM", 0) == 0,
            true)
      << q->path;
  EXPECT_TRUE(kernel_differences(*q, *find_op(*b2, "q_proj", 0)).empty());

  // The summary prints them under the first divergence.
  const ComparisonResult* c = r.comparison("ref__b2");
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->first.found());
  const std::vector<std::string> lines = first_divergence_kernels(r, *c);
  ASSERT_EQ(lines.size(), 3U) << summary_text(r);
  EXPECT_EQ(lines[0], "selfcond_matmul, B=1: emulated split-K: 4 K-chunks");
  EXPECT_EQ(lines[1], "selfcond_matmul, B=2: emulated split-K: 2 K-chunks");
  EXPECT_EQ(lines[2],
            "selfcond_matmul differs: path: emulated split-K: 4 K-chunks → emulated split-K: 2 "
            "K-chunks");
  EXPECT_NE(summary_text(r).find("      kernels: selfcond_matmul, B=2"), std::string::npos);
  EXPECT_EQ(summary_json(r)["comparisons"][1]["first_divergence_kernels"].size(), 3U);
  // summary --kernels: per engine, the ops that differ from the reference's.
  const std::string all = kernels_text(r);
  EXPECT_NE(all.find("b2 (B=2, with self-conditioning): "), std::string::npos) << all;
  EXPECT_NE(all.find("    selfcond_matmul: path: emulated split-K: 4 K-chunks"), std::string::npos)
      << all;

  // The record travels in the file.
  const fs::path path =
      fs::path(::testing::TempDir()) / ("kernels_" + std::to_string(::getpid()) + ".h5");
  ASSERT_TRUE(io::write_experiment(path, r).ok());
  const auto back = io::read_experiment(path);
  fs::remove(path);
  ASSERT_TRUE(back.ok()) << back.error().message;
  ASSERT_TRUE(back.value().kernels.has_value());
  EXPECT_EQ(to_json(*back.value().kernels), to_json(*r.kernels));
  EXPECT_EQ(first_divergence_kernels(back.value(), *back.value().comparison("ref__b2")), lines);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Recording is a separate pass: the runs' numbers are the same with and without it.
TEST(Kernels, RecordingDoesNotChangeTheRuns) {
  const ExperimentResult with = run(evidence_spec("emulated_h200", true));
  const ExperimentResult without = run(evidence_spec("emulated_h200", false));
  EXPECT_FALSE(without.kernels.has_value());
  ASSERT_EQ(with.runs.size(), without.runs.size());
  for (std::size_t i = 0; i < with.runs.size(); ++i) {
    EXPECT_EQ(with.runs[i].tokens, without.runs[i].tokens);
    EXPECT_EQ(with.runs[i].argmax.data, without.runs[i].argmax.data);
  }
  ASSERT_EQ(with.comparisons.size(), without.comparisons.size());
  for (std::size_t i = 0; i < with.comparisons.size(); ++i) {
    // Bit for bit (not-compared cells are NaN, which == would never call equal).
    EXPECT_TRUE(same_bits(with.comparisons[i].max_ulp.data, without.comparisons[i].max_ulp.data));
    EXPECT_TRUE(
        same_bits(with.comparisons[i].frac_differ.data, without.comparisons[i].frac_differ.data));
    EXPECT_TRUE(same_bits(with.comparisons[i].max_abs.data, without.comparisons[i].max_abs.data));
  }
}

TEST(Kernels, DifferencesNameKernelTileSplitAndLaunchShape) {
  OpKernels a;
  a.path = "at::linear → cuBLAS";
  a.kernels.push_back(
      KernelLaunch{"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_"
                   "warpgroupsize1x1x1_execute_segment_k_off_kernel",
                   {2, 16, 1},
                   {128, 1, 1},
                   1,
                   5.0});
  OpKernels b = a;
  b.kernels[0].name =
      "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_"
      "warpgroupsize2x1x1_execute_segment_k_off_kernel";
  b.kernels.push_back(KernelLaunch{"splitKreduce_kernel", {8, 1, 1}, {256, 1, 1}, 1, 1.0});
  const std::vector<std::string> d = kernel_differences(a, b);
  const auto has = [&](const std::string& text) {
    for (const std::string& x : d) {
      if (x.find(text) != std::string::npos) {
        return true;
      }
    }
    return false;
  };
  EXPECT_TRUE(has("kernel: sm90_xmma_gemm")) << nlohmann::json(d).dump();
  EXPECT_TRUE(has("tile 64x64x64 → 128x128x64"));
  EXPECT_TRUE(has("split-K: no → yes"));
  EXPECT_TRUE(has("kernels per op: 1 → 2"));
  OpKernels c = a;
  c.kernels[0].grid = {4, 16, 1};
  const std::vector<std::string> g = kernel_differences(a, c);
  ASSERT_EQ(g.size(), 1U);
  EXPECT_NE(g[0].find("grid [2,16,1] → [4,16,1]"), std::string::npos) << g[0];
  EXPECT_TRUE(kernel_differences(a, a).empty());
  EXPECT_NE(describe(a).find("grid [2,16,1] block [128,1,1]"), std::string::npos);
  // Another main kernel, the same reduction launched over fewer splits (the H200's
  // self-conditioning matmul at B=1 and B=4): both said, argument lists left out.
  OpKernels h1;
  h1.kernels = {
      KernelLaunch{
          "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_splitK_NNT", {2, 66, 1}, {384, 1, 1}, 1, 9.0},
      KernelLaunch{"void cublasLt::splitKreduce_kernel<32, 16, int, "
                   "float>(cublasLt::cublasSplitKParams<float>, float const*)",
                   {88, 8, 1},
                   {32, 16, 1},
                   1,
                   2.0}};
  OpKernels h4 = h1;
  h4.kernels[0].name = "nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_splitK_NNT";
  h4.kernels[1].grid = {88, 6, 1};
  const std::vector<std::string> h = kernel_differences(h1, h4);
  ASSERT_EQ(h.size(), 3U) << nlohmann::json(h).dump();
  EXPECT_EQ(h[1], "tile 256x128 → 192x128");
  EXPECT_EQ(h[2],
            "launch of cublasLt::splitKreduce_kernel<32, 16, int, float>: grid [88,8,1] → "
            "[88,6,1], block [32,16,1] → [32,16,1]");
}

TEST(Kernels, MalformedRecordsAreRefusedAsCorrupt) {
  const auto refused = [](const char* text) {
    const auto r = kernels_from_json(nlohmann::json::parse(text));
    return !r.ok() && r.error().code == base::ErrorCode::FileCorrupted;
  };
  EXPECT_TRUE(refused(R"([])"));
  EXPECT_TRUE(refused(R"({"engines": 3})"));
  EXPECT_TRUE(refused(R"({"engines": [{"run": "ref", "batch_size": 0, "ops": []}]})"));
  EXPECT_TRUE(refused(R"({"engines": [{"run": 7, "batch_size": 1, "ops": []}]})"));
  EXPECT_TRUE(
      refused(R"({"engines": [{"batch_size": 1, "ops": [{"kernels": [{"grid": [1, 2]}]}]}]})"));
  EXPECT_TRUE(refused(R"({"engines": [{"batch_size": 1, "ops": [{"kernels": 5}]}]})"));
  nlohmann::json long_name = {{"engines", {{{"batch_size", 1}, {"ops", nlohmann::json::array()}}}}};
  long_name["engines"][0]["run"] = std::string(5000, 'x');
  EXPECT_FALSE(kernels_from_json(long_name).ok());
  const auto ok = kernels_from_json(nlohmann::json::parse(
      R"({"source": "s", "engines": [{"run": "b2", "batch_size": 2, "self_conditioning": true,
          "ops": [{"family": "q_proj", "layer": 0, "path": "p",
                   "kernels": [{"name": "k", "grid": [1, 2, 3], "block": [4, 5, 6], "calls": 2}]}]}]})"));
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  ASSERT_NE(ok.value().engine("b2", true), nullptr);
  EXPECT_EQ(ok.value().engine("b2", true)->ops[0].kernels[0].grid[2], 3);
}

}  // namespace
}  // namespace batchlens::experiment
