// SPDX-License-Identifier: Apache-2.0
// Mixed batches (issue #35): the prompt under test in row K beside companions of other lengths,
// left-padded, masked and positioned as transformers' generate does it (shared) or from each
// row's own mask (per_row). The B=1 reference is the prompt alone. On this CPU, with every op
// batch-invariant, what remains of a divergence is the batch's layout: shared positions shift a
// padded row's positions and change its text; per-row positions give it its text alone.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/analysis/causes.h"
#include "core/analysis/explain.h"
#include "core/analysis/story.h"
#include "core/base/system_info.h"
#include "core/compat/torch_compat.h"
#include "core/experiment/command_line.h"
#include "core/experiment/plan.h"
#include "core/experiment/runner.h"
#include "core/generation/engine.h"
#include "core/io/experiment_file.h"
#include "core/setup/front_door.h"

#include <unistd.h>

namespace batchlens::experiment {
namespace {

// The prompt under test is short: beside the longer companions it is left-padded.
ExperimentSpec mixed_spec(const std::string& policy, generation::PositionMode positions) {
  ExperimentSpec s;
  s.model.preset = "demo";
  s.prompt = "Tides?";
  s.seed = 3;
  s.overrides.max_denoising_steps = 6;
  s.overrides.max_new_tokens = 64;  // two canvases: the commit at per-row positions too
  s.batch_sizes = {2, 4};
  s.repeats = 0;
  s.prefill = generation::PrefillMode::Batched;
  s.policy = ops::policy_from_argument(policy).value();
  s.composition.companions = {
      {"Write a long essay about Portugal, its history, its sea and its language.", true, {}},
      {"Explain how a lighthouse works, and why its light turns.", true, {}}};
  s.composition.positions = positions;
  return s;
}

ExperimentResult run_ok(const ExperimentSpec& s) {
  auto r = run_experiment(s);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? r.value() : ExperimentResult{};
}

// The reason the padded row differs from itself alone on this CPU even with per-row positions,
// or empty when it should not.
std::string mask_changes_bits() {
  if (compat::sdpa_backend() != compat::SdpaBackend::Math) {
    return "LibTorch's own attention may pick another kernel for a masked call; this is about "
           "BatchLens's math path (LibTorch < 2.1)";
  }
  if (base::query_cpu_isa().aten_capability == "DEFAULT") {
    return "ATen's DEFAULT kernels reduce a padded row in another order (measured, ADR 4)";
  }
  return {};
}

TEST(Composition, BatchRowsPutThePromptInItsRowAndCycleTheCompanions) {
  const std::vector<std::int64_t> p{1, 2};
  const std::vector<std::vector<std::int64_t>> c{{7}, {8, 8}};
  const auto rows = generation::batch_rows(p, c, 4, 1);
  ASSERT_EQ(rows.size(), 4U);
  EXPECT_EQ(rows[0], c[0]);
  EXPECT_EQ(rows[1], p);
  EXPECT_EQ(rows[2], c[1]);
  EXPECT_EQ(rows[3], c[0]);
  EXPECT_EQ(generation::batch_rows(p, {}, 3, 0), (std::vector<std::vector<std::int64_t>>{p, p, p}));
}

TEST(Composition, SpecJsonKeepsItOnlyWhenSetAndRoundTrips) {
  ExperimentSpec plain;
  plain.model.preset = "demo";
  EXPECT_FALSE(to_json(plain).contains("composition"));
  ExperimentSpec s = mixed_spec("default", generation::PositionMode::PerRow);
  s.composition.row = 1;
  s.composition.companions.push_back({"", false, {2, 105, 9}});
  const auto back = spec_from_json(to_json(s));
  ASSERT_TRUE(back.ok()) << back.error().message;
  const Composition& c = back.value().composition;
  ASSERT_EQ(c.companions.size(), 3U);
  EXPECT_EQ(c.companions[0].text, s.composition.companions[0].text);
  EXPECT_EQ(c.companions[2].ids, (std::vector<std::int64_t>{2, 105, 9}));
  EXPECT_FALSE(c.companions[2].chat_template);
  EXPECT_EQ(c.row, 1);
  EXPECT_EQ(c.positions, generation::PositionMode::PerRow);
  // A damaged composition is FileCorrupted naming the companion.
  nlohmann::json doc = to_json(s);
  doc["composition"]["companions"][1]["prompt"] = 5;
  const auto bad = spec_from_json(doc);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("companion 2"), std::string::npos) << bad.error().message;
  doc = to_json(s);
  doc["composition"]["positions"] = "sideways";
  EXPECT_FALSE(spec_from_json(doc).ok());
  // The command line says what it cannot hold.
  const std::string cmd = cli_run_command(s, {}, "x.h5");
  EXPECT_NE(cmd.find("--companions"), std::string::npos) << cmd;
  EXPECT_NE(cmd.find("--row 1"), std::string::npos) << cmd;
  EXPECT_NE(cmd.find("--positions per_row"), std::string::npos) << cmd;
  EXPECT_NE(cmd.find("3 companion prompts"), std::string::npos) << cmd;
}

TEST(Composition, BadCompositionsAreRefusedBeforeAnyWork) {
  const auto refused = [](const ExperimentSpec& s, const std::string& reason) {
    const auto r = run_experiment(s);
    ASSERT_FALSE(r.ok()) << reason;
    EXPECT_EQ(r.error().code, base::ErrorCode::InvalidArgument);
    EXPECT_NE(r.error().message.find(reason), std::string::npos) << r.error().message;
  };
  ExperimentSpec s = mixed_spec("default", generation::PositionMode::Shared);
  s.composition.row = 2;  // the smallest batch has 2 rows
  refused(s, "row under test must be in 0..1");
  s = mixed_spec("default", generation::PositionMode::Shared);
  s.prefill = generation::PrefillMode::Copied;
  refused(s, "prefill 'batched'");
  s = mixed_spec("default", generation::PositionMode::PerRow);
  s.composition.companions.clear();
  refused(s, "give companions");
  s = mixed_spec("default", generation::PositionMode::Shared);
  s.composition.companions.push_back({"", true, {}});
  refused(s, "companion 3 is empty");
  s = mixed_spec("default", generation::PositionMode::Shared);
  s.composition.companions[1].text = std::string("caf\xC3", 4);
  refused(s, "companion 2");
  // Too long for the context: the demo model's positions, counted with its canvases.
  s = mixed_spec("default", generation::PositionMode::Shared);
  s.composition.companions[1] = {"", false, std::vector<std::int64_t>(200000, 9)};
  refused(s, "companion 2 is too long for the model's context");
}

TEST(Composition, SharedPositionsMoveAPaddedRowEvenWithEveryOpBatchInvariant) {
  // Row 0 ("Tides?") is padded beside longer prompts; every matmul-like op is batch-invariant,
  // so the kernels cannot be the cause: shared positions shift its rotary positions.
  const ExperimentResult r =
      run_ok(mixed_spec("batch_invariant", generation::PositionMode::Shared));
  const ComparisonResult* b2 = r.comparison("ref__b2");
  const ComparisonResult* b4 = r.comparison("ref__b4");
  ASSERT_NE(b2, nullptr);
  ASSERT_NE(b4, nullptr);
  EXPECT_TRUE(b2->first.found());
  EXPECT_TRUE(b4->first.found());
  EXPECT_FALSE(b4->tokens_identical);
  EXPECT_EQ(r.spec.composition.companions.size(), 2U);
}

TEST(Composition, PerRowPositionsGiveThePaddedRowItsTextAlone) {
  if (const std::string why = mask_changes_bits(); !why.empty()) {
    GTEST_SKIP() << why;
  }
  for (const std::int64_t row : {0, 1}) {
    ExperimentSpec s = mixed_spec("batch_invariant", generation::PositionMode::PerRow);
    s.composition.row = row;
    const ExperimentResult r = run_ok(s);
    for (const char* id : {"ref__b2", "ref__b4"}) {
      const ComparisonResult* c = r.comparison(id);
      ASSERT_NE(c, nullptr) << id;
      EXPECT_FALSE(c->first.found()) << "row " << row << " " << id << ": " << describe(c->first);
      EXPECT_TRUE(c->tokens_identical) << "row " << row << " " << id;
    }
    EXPECT_EQ(r.run("b4")->text, r.run("ref")->text) << "row " << row;
  }
}

TEST(Composition, LockstepFollowsTheTestRowAndLeavesTheCompanionsFree) {
  if (const std::string why = mask_changes_bits(); !why.empty()) {
    GTEST_SKIP() << why;
  }
  ExperimentSpec s = mixed_spec("batch_invariant", generation::PositionMode::PerRow);
  s.mode = RunMode::Lockstep;
  s.composition.row = 1;
  const ExperimentResult r = run_ok(s);
  // No rows-within-a-batch comparison: the rows hold other prompts.
  ASSERT_EQ(r.comparisons.size(), 2U);
  for (const auto& c : r.comparisons) {
    EXPECT_FALSE(c.first.found()) << c.id << ": " << describe(c.first);
  }
}

// A row that stops in an earlier canvas than its batch (the H100 sample found it): its output
// ends with the canvas of its EOS, as alone, not with the batch's later canvases of pads.
TEST(Composition, ARowThatStopsEarlyEndsWithItsOwnCanvas) {
  model::ModelSource source;
  source.preset = "demo-trained";
  const auto session = setup::open_model(source, model::LoadOptions{});
  ASSERT_TRUE(session.ok()) << session.error().message;
  const auto ids = [&](const std::string& text) {
    auto in = session.value().prepare({text, true, {}}, {});
    EXPECT_TRUE(in.ok());
    return in.ok() ? in.value().prompt_ids : std::vector<std::int64_t>{};
  };
  generation::GenerateOptions o;
  o.batch_size = 2;
  o.seed = 1;
  o.prefill = generation::PrefillMode::Batched;
  o.positions = generation::PositionMode::PerRow;
  auto config = session.value().prepare({"x", true, {}}, {});
  ASSERT_TRUE(config.ok());
  o.config = config.value().generation;
  const std::vector<std::int64_t> lord = ids("The LORD is my shepherd; I shall not want.");
  const std::vector<std::int64_t> genesis =
      ids("In the beginning God created the heaven and the earth.");
  const generation::GenerationResult r =
      generation::generate(*session.value().model, generation::pad_left({lord, genesis}, 0), o);
  const std::int64_t c = session.value().model->config().canvas_length;
  ASSERT_EQ(r.canvases, 2) << "the second row needs a second canvas for this test";
  const generation::RowOutcome& early = r.rows[0];
  ASSERT_GE(early.stop_position, 0);
  ASSERT_LT(early.stop_position, c);
  EXPECT_EQ(static_cast<std::int64_t>(early.tokens.size()), c);
  EXPECT_EQ(early.steps.size(), 1U);
  EXPECT_EQ(static_cast<std::int64_t>(r.rows[1].tokens.size()), 2 * c);
  // The batch's sequences keep every canvas of every row (transformers' output).
  const auto longest = static_cast<std::int64_t>(std::max(lord.size(), genesis.size()));
  EXPECT_EQ(r.sequences.size(1), longest + 2 * c);
}

CauseReport with_trials(bool invariant, bool per_row, bool both) {
  CauseReport r;
  r.trials = {{"batch_invariant", "", "shared", invariant, "", 0},
              {"per_row", "", "per_row", per_row, "", 0},
              {"per_row+batch_invariant", "", "per_row", both, "", 0}};
  return r;
}

TEST(Causes, TheRerunsTellPositionsPaddingAndKernelsApart) {
  using V = std::vector<std::string>;
  CauseReport r = with_trials(false, false, false);
  analysis::judge_causes(true, r);
  EXPECT_EQ(r.causes, V{"kernels"}) << r.verdict;
  r = with_trials(true, false, false);
  analysis::judge_causes(true, r);
  EXPECT_EQ(r.causes, V{"positions"}) << r.verdict;
  r = with_trials(true, true, false);
  analysis::judge_causes(true, r);
  EXPECT_EQ(r.causes, (V{"positions", "kernels"})) << r.verdict;
  r = with_trials(true, true, true);
  analysis::judge_causes(true, r);
  EXPECT_EQ(r.causes, V{"mask"}) << r.verdict;
  r = with_trials(true, true, true);
  analysis::judge_causes(false, r);
  EXPECT_TRUE(r.causes.empty());
  EXPECT_NE(r.verdict.find("no divergence"), std::string::npos);
  CauseReport none;
  analysis::judge_causes(true, none);
  EXPECT_NE(none.verdict.find("not separated"), std::string::npos);
}

TEST(Causes, JsonRoundTripsAndRefusesDamage) {
  CauseReport r = with_trials(true, false, false);
  r.rows = {{"b2", 2, 4, 4, 6, 10}, {"b4", 4, 0, 0, 10, 10}};
  analysis::judge_causes(true, r);
  const auto back = causes_from_json(to_json(r));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(to_json(back.value()), to_json(r));
  EXPECT_EQ(r.layout_text(),
            "B=2: 4 padding slots masked, positions shifted by 4; B=4: no padding (its prompt "
            "is the longest), positions as alone");
  nlohmann::json bad = to_json(r);
  bad["rows"][0]["pad_slots"] = "four";
  EXPECT_FALSE(causes_from_json(bad).ok());
  bad = to_json(r);
  bad["trials"] = 3;
  EXPECT_FALSE(causes_from_json(bad).ok());
  EXPECT_FALSE(causes_from_json(nlohmann::json::array()).ok());
}

// The emulated GPU kernels beside other prompts: a padded row's divergence is its positions (and
// the kernels once they are per-row); the longest row's is the kernels alone. The file keeps it.
TEST(Causes, EmulatedKernelsBesideOtherPromptsAreToldApartAndKeptInTheFile) {
  if (const std::string why = mask_changes_bits(); !why.empty()) {
    GTEST_SKIP() << why;
  }
  ExperimentSpec s = mixed_spec("emulated_split_k", generation::PositionMode::Shared);
  s.batch_sizes = {2};
  s.overrides.max_new_tokens = 32;
  auto padded = analysis::run_and_explain(s);
  ASSERT_TRUE(padded.ok()) << padded.error().message;
  const CauseReport& c = padded.value().causes.value();
  ASSERT_EQ(c.rows.size(), 1U);
  EXPECT_GT(c.rows[0].pad_slots, 0);
  EXPECT_EQ(c.rows[0].position_shift, c.rows[0].pad_slots);
  ASSERT_EQ(c.trials.size(), 3U);
  EXPECT_EQ(c.causes.front(), "positions") << c.verdict;
  EXPECT_FALSE(c.trials[2].diverges) << c.trials[2].first;
  // The headline says it.
  const std::string headline = analysis::build_story(padded.value(), "ref__b2").headline();
  EXPECT_NE(headline.find("→ caused by the positions"), std::string::npos) << headline;
  const std::string pad = std::to_string(c.rows[0].pad_slots);
  EXPECT_NE(headline.find("(" + pad + " padding slots, positions shifted by " + pad + ")"),
            std::string::npos)
      << headline;
  const std::string path = (std::filesystem::path(::testing::TempDir()) /
                            ("bl_causes_" + std::to_string(::getpid()) + ".h5"))
                               .string();
  ASSERT_TRUE(io::write_experiment(path, padded.value()).ok());
  const auto read = io::read_experiment(path);
  ASSERT_TRUE(read.ok()) << read.error().message;
  ASSERT_TRUE(read.value().causes.has_value());
  EXPECT_EQ(to_json(*read.value().causes), to_json(c));
  // The exact reference at the divergence (run_and_explain's), kept in the file (schema 1.7).
  ASSERT_TRUE(padded.value().exact.has_value());
  ASSERT_TRUE(read.value().exact.has_value());
  EXPECT_EQ(to_json(*read.value().exact), to_json(*padded.value().exact));
  ASSERT_NE(padded.value().exact->find("ref__b2"), nullptr);
  EXPECT_EQ(to_json(read.value().spec), to_json(s));
  std::filesystem::remove(path);

  // The prompt under test is the longest: nothing of its layout differs from B=1's.
  ExperimentSpec longest = s;
  longest.prompt =
      "Write a long essay about Portugal, its history, its sea, its language and "
      "its people, please.";
  const auto r = analysis::run_and_explain(longest);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const CauseReport& k = r.value().causes.value();
  EXPECT_EQ(k.rows.at(0).pad_slots, 0);
  EXPECT_EQ(k.causes, std::vector<std::string>{"kernels"}) << k.verdict;
}

}  // namespace
}  // namespace batchlens::experiment
