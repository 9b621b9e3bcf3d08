// SPDX-License-Identifier: Apache-2.0
// The workaround group run on its own and merged into a shown experiment (issue #16): equal to
// the whole spec run with the workaround at once, with the shown experiment's settings.
#include "core/experiment/runner.h"

#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "core/experiment/plan.h"

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

void expect_same_run(const RunResult& a, const RunResult& b) {
  SCOPED_TRACE(a.id);
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.batch_size, b.batch_size);
  EXPECT_EQ(a.group, b.group);
  EXPECT_EQ(a.policy_json, b.policy_json);
  EXPECT_EQ(a.policy_text, b.policy_text);
  EXPECT_EQ(a.emulated, b.emulated);
  EXPECT_TRUE(same_bits(a.canvas_in, b.canvas_in));
  EXPECT_TRUE(same_bits(a.argmax, b.argmax));
  EXPECT_TRUE(same_bits(a.sampled, b.sampled));
  EXPECT_TRUE(same_bits(a.accepted, b.accepted));
  EXPECT_TRUE(same_bits(a.entropy, b.entropy));
  EXPECT_EQ(a.tick_canvas, b.tick_canvas);
  EXPECT_EQ(a.tick_step, b.tick_step);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(a.stop_position, b.stop_position);
  EXPECT_EQ(a.steps, b.steps);
}

void expect_same_comparison(const ComparisonResult& a, const ComparisonResult& b) {
  SCOPED_TRACE(a.id);
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.reference, b.reference);
  EXPECT_EQ(a.run, b.run);
  EXPECT_EQ(a.kind, b.kind);
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
  EXPECT_EQ(a.compared, b.compared);
  EXPECT_EQ(describe(a.first), describe(b.first));
  EXPECT_EQ(a.first.tick, b.first.tick);
  EXPECT_EQ(a.tokens_identical, b.tokens_identical);
  EXPECT_EQ(a.tokens_changed, b.tokens_changed);
  EXPECT_EQ(a.stop_changed, b.stop_changed);
  EXPECT_EQ(a.steps_changed, b.steps_changed);
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
  static setup::Session* session_;
};
setup::Session* WorkaroundGroup::session_ = nullptr;

TEST_F(WorkaroundGroup, MergedEqualsTheWholeSpecRunAtOnce) {
  ExperimentSpec with = demo_spec();
  with.workaround = ops::OpPolicy::issue_workaround();
  auto whole = run_experiment(*session_, with);
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  auto shown = run_experiment(*session_, demo_spec());
  ASSERT_TRUE(shown.ok()) << shown.error().message;
  std::int64_t ticks = 0;
  base::ProgressFn progress = [&ticks](const base::Progress&) {
    ++ticks;
  };
  RunControl control;
  control.progress = progress;
  auto merged =
      run_workaround_group(*session_, shown.value(), ops::OpPolicy::issue_workaround(), control);
  ASSERT_TRUE(merged.ok()) << merged.error().message;
  expect_same_result(merged.value(), whole.value());
  // Only the missing runs ran: the workaround's reference and batch sizes, no repeat.
  std::int64_t wa_steps = 0;
  for (const RunResult& r : merged.value().runs) {
    if (r.group == "workaround") {
      wa_steps = std::max<std::int64_t>(wa_steps, static_cast<std::int64_t>(r.tick_step.size()));
    }
  }
  EXPECT_EQ(ticks, wa_steps);
  // The story of the H200 profile: the main runs diverge, the workaround makes them identical.
  for (const ComparisonResult& c : merged.value().comparisons) {
    if (c.id.rfind("wa.", 0) == 0) {
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
  auto shown = run_experiment(*session_, with);
  ASSERT_TRUE(shown.ok()) << shown.error().message;
  auto merged = run_workaround_group(*session_, shown.value(), ops::OpPolicy::issue_workaround());
  ASSERT_TRUE(merged.ok()) << merged.error().message;
  with.workaround = ops::OpPolicy::issue_workaround();
  auto whole = run_experiment(*session_, with);
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  expect_same_result(merged.value(), whole.value());
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
  auto shown = run_experiment(*session_, demo_spec());
  ASSERT_TRUE(shown.ok()) << shown.error().message;
  ExperimentResult other = shown.value();
  other.taps.pop_back();
  refused = run_workaround_group(*session_, other, ops::OpPolicy::issue_workaround());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("tap list"), std::string::npos) << refused.error().message;
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
