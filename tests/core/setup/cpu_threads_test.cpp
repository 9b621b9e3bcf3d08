// SPDX-License-Identifier: Apache-2.0
// A CPU model's threads chosen by measurement at load (setup/cpu_threads.h, issue #34): both
// counts measured and the choice applied to the calling thread, one thread offered or a model on
// a GPU left alone, the switch that turns it off; and what an experiment computes does not depend
// on the choice (how, never what).
#include "core/setup/cpu_threads.h"

#include <cstring>
#include <string>

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "core/experiment/runner.h"
#include "core/setup/front_door.h"

namespace batchlens::setup {
namespace {

Session tiny_session(bool choose) {
  model::ModelSource source;
  source.preset = "tiny";
  source.seed = 5;
  model::LoadOptions load;
  load.device = "cpu";
  load.switches.thread_choice = choose;
  auto s = open_model(source, load);
  EXPECT_TRUE(s.ok()) << s.error().message;
  return std::move(s).value();
}

// Restores the calling thread's LibTorch threads.
struct KeepThreads {
  int threads = at::get_num_threads();
  KeepThreads() = default;
  KeepThreads(const KeepThreads&) = delete;
  KeepThreads& operator=(const KeepThreads&) = delete;
  KeepThreads(KeepThreads&&) = delete;
  KeepThreads& operator=(KeepThreads&&) = delete;
  ~KeepThreads() { at::set_num_threads(threads); }
};

TEST(CpuThreads, BothCountsAreMeasuredAndTheChoiceApplies) {
  const KeepThreads keep;
  const Session s = tiny_session(false);
  EXPECT_EQ(s.threads_report, "");  // BATCHLENS_THREAD_CHOICE=0: nothing measured
  at::set_num_threads(2);
  const ThreadChoice c = choose_cpu_threads(*s.model, 1.0);
  EXPECT_EQ(c.offered, 2);
  EXPECT_TRUE(c.threads == 1 || c.threads == 2) << c.threads;
  EXPECT_EQ(at::get_num_threads(), c.threads);
  EXPECT_GT(c.ms_one, 0.0);
  EXPECT_GT(c.ms_offered, 0.0);
  EXPECT_NE(c.report.find("chosen at load"), std::string::npos) << c.report;
  if (c.threads == 1) {
    EXPECT_TRUE(c.same_bits) << "one thread chosen although its bits differ: " << c.report;
    EXPECT_LT(c.ms_one, 0.8 * c.ms_offered) << c.report;
  }
  // One thread offered: nothing to choose, nothing measured.
  at::set_num_threads(1);
  const ThreadChoice one = choose_cpu_threads(*s.model);
  EXPECT_EQ(one.threads, 1);
  EXPECT_EQ(one.ms_one, 0.0);
  EXPECT_EQ(at::get_num_threads(), 1);
  // A load with the switch on says what it chose.
  at::set_num_threads(2);
  const Session chosen = tiny_session(true);
  EXPECT_NE(chosen.threads_report.find("CPU threads: "), std::string::npos);
}

// The same experiment on one thread and on two gives the same bits: the choice changes the
// speed only (the emulation, the taps and the sampler included).
TEST(CpuThreads, AnExperimentIsTheSameOnOneThreadAndOnTwo) {
  const KeepThreads keep;
  const Session s = tiny_session(false);
  experiment::ExperimentSpec spec;
  spec.model.preset = "tiny";
  spec.model.seed = 5;
  spec.batch_sizes = {2, 4};
  spec.overrides.max_denoising_steps = 3;
  spec.overrides.max_new_tokens = 16;
  spec.policy = ops::OpPolicy::emulation_profile("emulated_h200");
  at::set_num_threads(2);
  auto two = experiment::run_experiment(s, spec);
  ASSERT_TRUE(two.ok()) << two.error().message;
  at::set_num_threads(1);
  auto one = experiment::run_experiment(s, spec);
  ASSERT_TRUE(one.ok()) << one.error().message;
  ASSERT_EQ(one.value().runs.size(), two.value().runs.size());
  for (std::size_t i = 0; i < one.value().runs.size(); ++i) {
    EXPECT_EQ(one.value().runs[i].tokens, two.value().runs[i].tokens) << one.value().runs[i].id;
    EXPECT_EQ(one.value().runs[i].argmax.data, two.value().runs[i].argmax.data)
        << one.value().runs[i].id;
  }
  ASSERT_EQ(one.value().comparisons.size(), two.value().comparisons.size());
  for (std::size_t i = 0; i < one.value().comparisons.size(); ++i) {
    EXPECT_EQ(experiment::describe(one.value().comparisons[i].first),
              experiment::describe(two.value().comparisons[i].first));
    // Bit for bit (NaN marks what was not compared, and NaN != NaN).
    const auto& a = one.value().comparisons[i].frac_differ.data;
    const auto& b = two.value().comparisons[i].frac_differ.data;
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
        << one.value().comparisons[i].id;
  }
}

}  // namespace
}  // namespace batchlens::setup
