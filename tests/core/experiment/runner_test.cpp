// SPDX-License-Identifier: Apache-2.0
// The workaround group run on its own and merged into a shown experiment (issue #16): equal to
// the whole spec run with the workaround at once, with the shown experiment's settings.
#include "core/experiment/runner.h"

#include <cstring>
#include <functional>
#include <iostream>
#include <string>

#include <gtest/gtest.h>

#include "core/analysis/summary.h"
#include "core/experiment/plan.h"
#include "core/experiment/provenance.h"
#include "tests/support/gemm_probe.h"

namespace batchlens::experiment {
namespace {

// The GUI's one-click demo in small: the H200 emulation profile, one canvas, few steps.
ExperimentSpec demo_spec() {
  ExperimentSpec s;
  s.model.preset = "demo";
  s.prompt = "Write a long essay about Portugal.";
  s.seed = 5;
  s.overrides.max_denoising_steps = 6;
  s.overrides.max_new_tokens = 32;  // one canvas
  s.batch_sizes = {2, 4};
  s.policy = ops::OpPolicy::emulation_profile("emulated_h200");
  return s;
}

template <class T>
bool same_bits(const NdArray<T>& a, const NdArray<T>& b) {
  return a.shape == b.shape && a.data.size() == b.data.size() &&
         (a.data.empty() ||
          std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(T)) == 0);
}

// EXPECT_EQ on each of `members` of `a` and `b`.
template <class S, class... M>
void expect_same_members(const S& a, const S& b, M S::*... members) {
  int i = 0;
  const auto check = [&](auto member) {
    EXPECT_EQ(a.*member, b.*member) << "member " << i++;
  };
  (check(members), ...);
}

void expect_same_run(const RunResult& a, const RunResult& b) {
  SCOPED_TRACE(a.id);
  expect_same_members(a, b, &RunResult::id, &RunResult::batch_size, &RunResult::group,
                      &RunResult::policy_json, &RunResult::policy_text, &RunResult::emulated,
                      &RunResult::tick_canvas, &RunResult::tick_step, &RunResult::tokens,
                      &RunResult::text, &RunResult::stop_position, &RunResult::steps);
  EXPECT_TRUE(same_bits(a.canvas_in, b.canvas_in));
  EXPECT_TRUE(same_bits(a.argmax, b.argmax));
  EXPECT_TRUE(same_bits(a.sampled, b.sampled));
  EXPECT_TRUE(same_bits(a.accepted, b.accepted));
  EXPECT_TRUE(same_bits(a.entropy, b.entropy));
}

void expect_same_comparison(const ComparisonResult& a, const ComparisonResult& b) {
  SCOPED_TRACE(a.id);
  expect_same_members(a, b, &ComparisonResult::id, &ComparisonResult::reference,
                      &ComparisonResult::run, &ComparisonResult::kind, &ComparisonResult::compared,
                      &ComparisonResult::tokens_identical, &ComparisonResult::tokens_changed,
                      &ComparisonResult::stop_changed, &ComparisonResult::steps_changed);
  for (const auto& [x, y] : {std::pair{&a.frac_differ, &b.frac_differ},
                             {&a.max_abs, &b.max_abs},
                             {&a.max_ulp, &b.max_ulp},
                             {&a.pos_frac_differ, &b.pos_frac_differ},
                             {&a.pos_max_abs, &b.pos_max_abs},
                             {&a.pos_max_ulp, &b.pos_max_ulp},
                             {&a.router_margin, &b.router_margin}}) {
    EXPECT_TRUE(same_bits(*x, *y));
  }
  EXPECT_TRUE(same_bits(a.routing_flips, b.routing_flips));
  EXPECT_TRUE(same_bits(a.sampler_diff, b.sampler_diff));
  EXPECT_EQ(describe(a.first), describe(b.first));
  EXPECT_EQ(a.first.tick, b.first.tick);
  EXPECT_EQ(a.token_diff.size(), b.token_diff.size());
}

void expect_same_result(const ExperimentResult& a, const ExperimentResult& b) {
  EXPECT_EQ(to_json(a.spec), to_json(b.spec));
  EXPECT_EQ(a.prompt_ids, b.prompt_ids);
  EXPECT_EQ(a.taps, b.taps);
  EXPECT_EQ(a.provenance.emulated, b.provenance.emulated);
  ASSERT_EQ(a.runs.size(), b.runs.size());
  for (std::size_t i = 0; i < a.runs.size(); ++i) {
    expect_same_run(a.runs[i], b.runs[i]);
  }
  ASSERT_EQ(a.comparisons.size(), b.comparisons.size());
  for (std::size_t i = 0; i < a.comparisons.size(); ++i) {
    expect_same_comparison(a.comparisons[i], b.comparisons[i]);
  }
  // summary_text holds wall times; every value it prints is compared above.
}

class WorkaroundGroup : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto s = setup::open_model(demo_spec().model, demo_spec().load);
    ASSERT_TRUE(s.ok()) << s.error().message;
    session_ = new setup::Session(std::move(s).value());
  }
  static void TearDownTestSuite() {
    delete session_;
    session_ = nullptr;
  }
  // `spec` run on the session; an empty result (and a failure) when it does not run.
  static ExperimentResult run(const ExperimentSpec& spec) {
    auto r = run_experiment(*session_, spec);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    return r.ok() ? std::move(r).value() : ExperimentResult{};
  }
  // The workaround group added to `shown`: its error message, empty when it was added.
  static std::string refusal(const ExperimentResult& shown) {
    auto merged = run_workaround_group(*session_, shown, ops::OpPolicy::issue_workaround());
    if (merged.ok()) {
      return {};
    }
    EXPECT_EQ(merged.error().code, base::ErrorCode::InvalidArgument);
    return merged.error().message;
  }
  static setup::Session* session_;
};
setup::Session* WorkaroundGroup::session_ = nullptr;

TEST_F(WorkaroundGroup, MergedEqualsTheWholeSpecRunAtOnce) {
  ExperimentSpec with = demo_spec();
  with.workaround = ops::OpPolicy::issue_workaround();
  const ExperimentResult whole = run(with);
  const ExperimentResult shown = run(demo_spec());
  std::int64_t ticks = 0;
  base::ProgressFn progress = [&ticks](const base::Progress&) {
    ++ticks;
  };
  RunControl control;
  control.progress = progress;
  auto merged = run_workaround_group(*session_, shown, ops::OpPolicy::issue_workaround(), control);
  ASSERT_TRUE(merged.ok()) << merged.error().message;
  expect_same_result(merged.value(), whole);
  // Only the missing runs ran: the workaround's reference and batch sizes, no repeat.
  std::int64_t wa_steps = 0;
  for (const RunResult& r : merged.value().runs) {
    if (r.group == experiment::RunGroup::Workaround) {
      wa_steps = std::max<std::int64_t>(wa_steps, static_cast<std::int64_t>(r.tick_step.size()));
    }
  }
  EXPECT_EQ(ticks, wa_steps);
  // The story of the H200 profile: the main runs diverge, the workaround makes them identical
  // (where LibTorch's own CPU kernels are batch-invariant: on AMX CPUs they are not).
  const std::string cpu_varies = test::bf16_products_depend_on_rows();
  for (const ComparisonResult& c : merged.value().comparisons) {
    if (c.id.rfind("wa.", 0) == 0 && !cpu_varies.empty()) {
      std::cout << "[ note ] " << c.id << " not checked: " << cpu_varies << "\n";
    } else if (c.id.rfind("wa.", 0) == 0) {
      EXPECT_FALSE(c.first.found()) << c.id << " " << describe(c.first);
      EXPECT_TRUE(c.tokens_identical) << c.id;
    } else if (c.run != "repeat1") {
      EXPECT_TRUE(c.first.found()) << c.id;
      EXPECT_EQ(c.first.tap.rfind("selfcond", 0), 0U) << c.id << " " << c.first.tap;
    }
  }
}

TEST_F(WorkaroundGroup, AnotherWorkaroundReplacesTheShownOne) {
  ExperimentSpec with = demo_spec();
  with.batch_sizes = {2};
  with.workaround = ops::OpPolicy::row_wise_all();
  const ExperimentResult shown = run(with);
  auto merged = run_workaround_group(*session_, shown, ops::OpPolicy::issue_workaround());
  ASSERT_TRUE(merged.ok()) << merged.error().message;
  with.workaround = ops::OpPolicy::issue_workaround();
  expect_same_result(merged.value(), run(with));
}

TEST_F(WorkaroundGroup, AnExperimentOfAnotherDeviceOrModelIsRefused) {
  ExperimentResult gpu;
  gpu.spec = demo_spec();
  gpu.spec.load.device = "cuda:0";
  auto refused = run_workaround_group(*session_, gpu, ops::OpPolicy::issue_workaround());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, base::ErrorCode::InvalidArgument);
  EXPECT_NE(refused.error().message.find("cuda:0"), std::string::npos) << refused.error().message;

  // Same model, but the shown result's tap list is not what this spec taps: not extended.
  ExperimentResult other = run(demo_spec());
  other.taps.pop_back();
  EXPECT_NE(refusal(other).find("tap list"), std::string::npos) << refusal(other);
}

// A file has one provenance for all its runs: runs computed with other kernels than the shown
// ones (another LibTorch, ATen or oneDNN ISA, emulation profile) are refused, never merged
// under the shown experiment's provenance.
TEST_F(WorkaroundGroup, RunsComputedWithOtherKernelsAreNotAddedUnderTheShownProvenance) {
  const ExperimentResult shown = run(demo_spec());
  ASSERT_FALSE(shown.provenance.cpu.aten_capability.empty());
  struct Case {
    const char* expected;  // in the message
    std::function<void(ExperimentResult&)> change;
  };
  const std::vector<Case> cases{
      {"LibTorch 2.11.0 there",
       [](ExperimentResult& r) {
         r.provenance.libtorch = "2.11.0";
       }},
      {"ATen CPU kernels",
       [](ExperimentResult& r) {
         r.provenance.cpu.aten_capability =
             r.provenance.cpu.aten_capability == "AVX2" ? "AVX512" : "AVX2";
       }},
      {"oneDNN ISA",
       [](ExperimentResult& r) {
         r.provenance.cpu.onednn_isa =
             r.provenance.cpu.onednn_isa == "avx512_core_amx" ? "avx2" : "avx512_core_amx";
       }},
      {"bf16 matmuls by",
       [](ExperimentResult& r) {
         r.provenance.cpu.bf16_matmul =
             r.provenance.cpu.bf16_matmul.rfind("ATen", 0) == 0 ? "oneDNN" : "ATen";
       }},
      {"not recorded there",
       [](ExperimentResult& r) {
         r.provenance.cpu = {};
       }},
      {"policy emulated_h200",
       [](ExperimentResult& r) {
         // The profile as another build defined it: every GEMM family emulated.
         for (RunResult& run : r.runs) {
           run.policy_json = ops::to_json(ops::OpPolicy::emulated_split_k()).dump();
         }
       }},
  };
  for (const Case& c : cases) {
    ExperimentResult changed = shown;
    c.change(changed);
    const std::string message = refusal(changed);
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.expected << ": " << message;
    EXPECT_NE(message.find("would not be comparable"), std::string::npos) << message;
  }
  // What does not choose a kernel may differ: the host, its CPU's name and raw flags, threads.
  ExperimentResult elsewhere = shown;
  elsewhere.provenance.host = "another-host";
  elsewhere.provenance.device_name = "Another CPU";
  elsewhere.provenance.cpu.flags += " amx_tile";
  elsewhere.provenance.threads += 6;
  auto merged = run_workaround_group(*session_, elsewhere, ops::OpPolicy::issue_workaround());
  ASSERT_TRUE(merged.ok()) << merged.error().message;
  EXPECT_EQ(merged.value().provenance.host, "another-host") << "the shown provenance stays";
}

TEST(ProvenanceMismatches, NameWhatChoosesTheKernels) {
  Provenance gpu;
  gpu.device = "cuda:0";
  gpu.device_name = "NVIDIA H200";
  gpu.libtorch = "2.11.0";
  gpu.cuda = "13.0";
  gpu.cublas = "13.0.0";
  gpu.dtype = "bf16";
  EXPECT_TRUE(provenance_mismatches(gpu, gpu).empty());
  Provenance h100 = gpu;
  h100.device_name = "NVIDIA H100 80GB HBM3";
  h100.cublas = "12.8.4";
  h100.driver = "other";  // not compared
  EXPECT_EQ(provenance_mismatches(gpu, h100),
            (std::vector<std::string>{"GPU NVIDIA H200 there, NVIDIA H100 80GB HBM3 here",
                                      "cuBLAS 13.0.0 there, 12.8.4 here"}));
  Provenance cpu;
  cpu.device = "cpu";
  cpu.libtorch = "1.13.0";
  cpu.dtype = "bf16";
  cpu.cpu.aten_capability = "AVX2";
  cpu.cpu.onednn_isa = "avx2";
  cpu.cpu.bf16_matmul = "ATen";
  Provenance gemm = cpu;  // BatchLens's GEMM gives ATen's bits (checked at load)
  gemm.cpu.bf16_matmul = "ATen (BatchLens's CPU GEMM, checked bitwise at load)";
  EXPECT_TRUE(provenance_mismatches(cpu, gemm).empty());
  EXPECT_EQ(provenance_mismatches(gpu, cpu).front(), "device cuda:0 there, cpu here");
}

TEST(StepCount, CountsEveryEngineOfEveryGroup) {
  ExperimentSpec s = demo_spec();  // ref, repeat1, b2, b4
  StepCount n = count_steps(s, 32, 6, 32);
  EXPECT_EQ(n.canvases, 1);
  EXPECT_EQ(n.engine_steps, 4 * 6);
  EXPECT_EQ(n.row_steps, (1 + 1 + 2 + 4) * 6);
  s.workaround = ops::OpPolicy::issue_workaround();  // + wa.ref, wa.b2, wa.b4
  n = count_steps(s, 32, 6, 64);
  EXPECT_EQ(n.canvases, 2);
  EXPECT_EQ(n.engine_steps, 7 * 12);
  auto resolved = count_steps(demo_spec());
  ASSERT_TRUE(resolved.ok()) << resolved.error().message;
  EXPECT_EQ(resolved.value().canvases, 1);  // the demo's canvas holds 32 tokens
  EXPECT_EQ(resolved.value().steps_per_canvas, 6);
}

}  // namespace
}  // namespace batchlens::experiment
