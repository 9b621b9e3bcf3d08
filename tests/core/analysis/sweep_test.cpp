// SPDX-License-Identifier: Apache-2.0
// Sweeps (issue #19): statistics on a known set, prompt and seed parsing, and runs that commit
// every item on its own, resume, shard and refuse another sweep's folder.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/analysis/sweep_merge.h"
#include "core/analysis/sweep_records.h"
#include "core/analysis/sweep_report.h"
#include "core/analysis/sweep_slurm.h"
#include "core/analysis/sweep_spec.h"
#include "core/analysis/sweep_stats.h"
#include "core/base/cancel.h"
#include "core/experiment/runner.h"
#include "core/io/sweep_file.h"
#include "core/setup/front_door.h"
#include "tests/support/process.h"

#include <sys/stat.h>
#include <unistd.h>

namespace batchlens::experiment {
namespace {

using namespace batchlens::analysis;  // NOLINT(google-build-using-namespace): the units under test

namespace fs = std::filesystem;

fs::path sweep_dir(const std::string& name) {
  const fs::path p =
      fs::path(::testing::TempDir()) / ("bl_sweep_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p;
}

std::string read_sweep_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

SweepRow row(int item, int b, bool changed, std::int64_t tokens, int step,
             const std::string& families) {
  SweepRow r;
  r.item = item;
  r.batch_size = b;
  r.text_changed = changed;
  r.tokens_changed = tokens;
  r.tokens_total = 32;
  r.stop_changed = tokens > 10;
  r.first_canvas = step > 0 ? 0 : -1;
  r.first_step = step;
  r.first_families = families;
  return r;
}

TEST(Sweep, WilsonIntervalMatchesKnownValues) {
  const Interval a = wilson_interval(22, 24);  // the original report's count
  EXPECT_NEAR(a.lo, 0.741512, 1e-6);
  EXPECT_NEAR(a.hi, 0.976841, 1e-6);
  const Interval none = wilson_interval(0, 24);
  EXPECT_NEAR(none.lo, 0.0, 1e-12);
  EXPECT_NEAR(none.hi, 0.137976, 1e-6);
  const Interval all = wilson_interval(24, 24);
  EXPECT_NEAR(all.lo, 0.862024, 1e-6);
  EXPECT_DOUBLE_EQ(all.hi, 1.0);
  const Interval nothing = wilson_interval(0, 0);
  EXPECT_EQ(nothing.lo, 0.0);
  EXPECT_EQ(nothing.hi, 1.0);
}

TEST(Sweep, StatisticsOfAKnownSet) {
  std::vector<SweepRow> rows{row(0, 2, true, 12, 2, "selfcond_matmul"),
                             row(1, 2, true, 3, 2, "selfcond_matmul"),
                             row(2, 2, false, 0, -1, ""),
                             row(3, 2, true, 20, 5, "router_proj"),
                             row(0, 4, true, 7, 2, "selfcond_matmul"),
                             row(1, 4, false, 0, -1, "")};
  SweepRow fixed = row(0, 2, false, 0, -1, "");
  fixed.group = experiment::RunGroup::Workaround;
  rows.push_back(fixed);
  SweepSpec spec;
  spec.prompts = {{"a", true, {}}, {"b", true, {}}, {"c", true, {}}, {"d", true, {}}};
  const std::vector<SweepStats> s = sweep_stats(spec, rows);
  ASSERT_EQ(s.size(), 3U);
  EXPECT_EQ(s[0].group, experiment::RunGroup::Main);
  EXPECT_EQ(s[0].batch_size, 2);
  EXPECT_EQ(s[0].n, 4);
  EXPECT_EQ(s[0].text_changed, 3);
  EXPECT_DOUBLE_EQ(s[0].tokens_changed_median, 7.5);  // 0, 3, 12, 20
  EXPECT_EQ(s[0].tokens_changed_max, 20);
  EXPECT_EQ(s[0].stop_changed, 2);
  EXPECT_EQ(s[0].diverged, 3);
  EXPECT_EQ((s[0].first_steps.at({0, 2})), 2);
  EXPECT_EQ((s[0].first_steps.at({0, 5})), 1);
  EXPECT_EQ(s[0].first_families.at("selfcond_matmul"), 2);
  EXPECT_EQ(s[0].first_families.at("router_proj"), 1);
  EXPECT_NEAR(s[0].changed_ci.lo, wilson_interval(3, 4).lo, 1e-12);
  EXPECT_EQ(s[1].batch_size, 4);
  EXPECT_EQ(s[1].text_changed, 1);
  EXPECT_DOUBLE_EQ(s[1].tokens_changed_median, 3.5);
  EXPECT_EQ(s[2].group, experiment::RunGroup::Workaround);
  EXPECT_EQ(s[2].text_changed, 0);
  // Rows survive their JSON; bad rows are refused.
  const auto back = sweep_row_from_json(to_json(rows[3]));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(to_json(back.value()), to_json(rows[3]));
  nlohmann::json bad = to_json(rows[3]);
  bad["tokens_changed"] = -1;
  EXPECT_EQ(sweep_row_from_json(bad).error().code, base::ErrorCode::FileCorrupted);
  // More tokens changed than the reference has is an outcome (the run wrote a longer text).
  bad["tokens_changed"] = 99;
  EXPECT_TRUE(sweep_row_from_json(bad).ok());
  bad = to_json(rows[3]);
  bad["group"] = "other";
  EXPECT_FALSE(sweep_row_from_json(bad).ok());
  bad = to_json(rows[3]);
  bad.erase("seed");
  EXPECT_NE(sweep_row_from_json(bad).error().message.find("'seed'"), std::string::npos);
}

// Issue #35: the companions and the row under test as axes beside prompts and seeds: every
// combination is an item with its own spec, the statistics keep each value apart or take them
// together, and a sweep without the axes keeps its JSON (and so its id).
TEST(Sweep, CompanionsAndRowsAreAxes) {
  SweepSpec spec;
  spec.base.model.preset = "tiny";
  spec.base.batch_sizes = {2, 4};
  spec.prompts = {{"a", true, {}}, {"b", true, {}}};
  const std::string plain = to_json(spec).dump();
  EXPECT_EQ(plain.find("companion_sets"), std::string::npos) << plain;
  spec.companion_sets = {{}, {{"Explain tides, please, at length.", true, {}}}};
  spec.rows = {0, 1};
  ASSERT_TRUE(validate(spec).ok()) << validate(spec).error().message;
  EXPECT_TRUE(spec.mixed());
  const std::vector<SweepItem> items = sweep_items(spec);
  ASSERT_EQ(items.size(), 8U);  // 2 prompts x 1 seed x 2 sets x 2 rows
  EXPECT_EQ(items[5].prompt, 1);
  EXPECT_EQ(items[5].companions, 0);
  EXPECT_EQ(items[5].row, 1);
  const ExperimentSpec e = item_spec(spec, items[3]);  // prompt a, companions 2, row 1
  EXPECT_EQ(e.prompt, "a");
  ASSERT_EQ(e.composition.companions.size(), 1U);
  EXPECT_EQ(e.composition.row, 1);
  EXPECT_EQ(e.prefill, generation::PrefillMode::Batched);
  EXPECT_FALSE(item_spec(spec, items[0]).composition.mixed());
  // JSON round trip; the id changes with the axes.
  const auto back = sweep_spec_from_json(to_json(spec));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(to_json(back.value()), to_json(spec));
  SweepSpec one = spec;
  one.rows = {0};
  EXPECT_NE(sweep_id(one), sweep_id(spec));
  // A row outside the smallest batch is refused by name.
  SweepSpec far = spec;
  far.rows = {0, 2};
  EXPECT_FALSE(validate(far).ok());
  nlohmann::json bad = to_json(spec);
  bad.erase("rows");
  EXPECT_FALSE(sweep_spec_from_json(bad).ok());
  // A spec of one run's options (companions in the base) puts them on the axes.
  SweepSpec from_run;
  from_run.base = spec.base;
  from_run.base.composition.companions = spec.companion_sets[1];
  from_run.base.composition.row = 1;
  from_run.prompts = spec.prompts;
  from_run.normalize_axes();
  EXPECT_EQ(from_run.companion_sets.size(), 1U);
  EXPECT_EQ(from_run.rows, (std::vector<std::int64_t>{1}));
  EXPECT_FALSE(from_run.base.composition.mixed());
  // Statistics per value of the axes, or all together; one value's rows.
  std::vector<SweepRow> rows;
  rows.reserve(items.size());
  for (const SweepItem& item : items) {
    rows.push_back(row(item.index, 2, item.companions == 1, item.companions == 1 ? 5 : 0,
                       item.companions == 1 ? 2 : -1, item.companions == 1 ? "router_proj" : ""));
  }
  const std::vector<SweepStats> apart = sweep_stats(spec, rows);
  ASSERT_EQ(apart.size(), 4U);  // B=2 x 2 sets x 2 rows
  EXPECT_EQ(apart[0].companions, 0);
  EXPECT_EQ(apart[0].row, 0);
  EXPECT_EQ(apart[0].n, 2);
  EXPECT_EQ(apart[0].text_changed, 0);
  EXPECT_EQ(apart[3].companions, 1);
  EXPECT_EQ(apart[3].row, 1);
  EXPECT_EQ(apart[3].text_changed, 2);
  const std::vector<SweepStats> together = sweep_stats(spec, rows, {false, false});
  ASSERT_EQ(together.size(), 1U);
  EXPECT_EQ(together[0].n, 8);
  EXPECT_EQ(together[0].text_changed, 4);
  EXPECT_EQ(together[0].companions, -1);
  EXPECT_EQ(rows_where(spec, rows, 1, -1).size(), 4U);
  EXPECT_EQ(rows_where(spec, rows, 1, 0).size(), 2U);
  EXPECT_EQ(companions_label(spec, 0), "identical rows");
  EXPECT_EQ(companions_label(spec, 1), "companions 2 (1 prompt)");
}

// Per-row positions are a sweep's too: kept through its JSON (sweep.json, a resumed run), part
// of its id, and the "identical rows" value of the axis runs with the positions it has anyway.
// (The H100's per_row sweep of issue #35 was refused at once: its base spec, its companions
// moved into the axis, failed the check "per_row needs companions".)
TEST(Sweep, PerRowPositionsSurviveTheAxes) {
  SweepSpec spec;
  spec.base.model.preset = "tiny";
  spec.base.batch_sizes = {4};
  spec.base.prefill = generation::PrefillMode::Batched;
  spec.base.composition.companions = {{"Explain tides, please, at length.", true, {}}};
  spec.base.composition.positions = generation::PositionMode::PerRow;
  spec.prompts = {{"a", true, {}}};
  spec.normalize_axes();
  ASSERT_FALSE(spec.base.composition.mixed());
  ASSERT_TRUE(validate(spec).ok()) << validate(spec).error().message;
  const auto back = sweep_spec_from_json(to_json(spec));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back.value().base.composition.positions, generation::PositionMode::PerRow);
  EXPECT_EQ(sweep_id(back.value()), sweep_id(spec));
  SweepSpec shared = spec;
  shared.base.composition.positions = generation::PositionMode::Shared;
  EXPECT_NE(sweep_id(shared), sweep_id(spec));
  // Shared positions add nothing to the JSON: the ids of sweeps recorded before stay.
  EXPECT_FALSE(to_json(shared).contains("positions"));
  const ExperimentSpec item = item_spec(spec, sweep_items(spec)[0]);
  EXPECT_EQ(item.composition.positions, generation::PositionMode::PerRow);
  ASSERT_TRUE(experiment::validate(item).ok());
  // Beside identical rows (the axis value "none") there is no padding: shared positions.
  spec.companion_sets.insert(spec.companion_sets.begin(), std::vector<setup::Prompt>{});
  ASSERT_TRUE(validate(spec).ok()) << validate(spec).error().message;
  const ExperimentSpec none = item_spec(spec, sweep_items(spec)[0]);
  EXPECT_FALSE(none.composition.mixed());
  EXPECT_EQ(none.composition.positions, generation::PositionMode::Shared);
  // A file's positions that are neither: refused by name.
  nlohmann::json bad = to_json(spec);
  bad["positions"] = "sideways";
  ASSERT_FALSE(sweep_spec_from_json(bad).ok());
  EXPECT_NE(sweep_spec_from_json(bad).error().message.find("positions"), std::string::npos);
}

TEST(Sweep, SeedsParse) {
  EXPECT_EQ(parse_seeds("0-3,7").value(), (std::vector<std::uint64_t>{0, 1, 2, 3, 7}));
  EXPECT_EQ(parse_seeds("5,5,2").value(), (std::vector<std::uint64_t>{2, 5}));
  for (const char* bad : {"", "3-1", "x", "1,,2", "0-100000", "-3"}) {
    EXPECT_FALSE(parse_seeds(bad).ok()) << bad;
  }
}

// The tiny preset, two prompts x two seeds, B=2 under the emulated split-K (texts change).
SweepSpec tiny_sweep() {
  SweepSpec s;
  s.base.model.preset = "tiny";
  s.base.overrides.max_denoising_steps = 3;
  s.base.overrides.max_new_tokens = 16;
  s.base.batch_sizes = {2};
  s.base.policy = ops::OpPolicy::emulation_profile("emulated_h200");
  s.prompts = {{"Write about Lisbon.", true, {}}, {"Explain tides.", true, {}}};
  s.seeds = {0, 1};
  return s;
}

const setup::Session& sweep_session() {
  static const setup::Session s = [] {
    const SweepSpec sweep = tiny_sweep();
    auto opened = open_session_for(item_spec(sweep, sweep_items(sweep).front()));
    EXPECT_TRUE(opened.ok()) << (opened.ok() ? "" : opened.error().message);
    return std::move(opened).value();
  }();
  return s;
}

std::vector<nlohmann::json> without_times(const std::vector<SweepRow>& rows) {
  std::vector<nlohmann::json> out;
  for (const SweepRow& r : rows) {
    nlohmann::json j = to_json(r);
    j.erase("wall_s");
    out.push_back(j);
  }
  return out;
}

TEST(Sweep, EveryItemIsCommittedAndARunAgainSkipsWhatIsDone) {
  const SweepSpec spec = tiny_sweep();
  const fs::path dir = sweep_dir("resume");
  SweepRunOptions opt;
  opt.dir = dir;
  auto first = run_sweep(sweep_session(), spec, opt);
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(first.value().items_run, 4);
  EXPECT_EQ(first.value().rows.size(), 4U);  // one batch size, one group
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(fs::exists(dir / "items" / ("item-00000" + std::to_string(i) + ".json"))) << i;
  }
  const std::string kept = read_sweep_text(dir / "items" / "item-000000.json");
  // A run again does nothing and rewrites nothing.
  auto again = run_sweep(sweep_session(), spec, opt);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again.value().items_run, 0);
  EXPECT_EQ(again.value().items_skipped, 4);
  EXPECT_EQ(without_times(again.value().rows), without_times(first.value().rows));
  // A lost item is run again, alone; the others stay as they were.
  fs::remove(dir / "items" / "item-000002.json");
  auto third = run_sweep(sweep_session(), spec, opt);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third.value().items_run, 1);
  EXPECT_EQ(without_times(third.value().rows), without_times(first.value().rows));
  EXPECT_EQ(read_sweep_text(dir / "items" / "item-000000.json"), kept);
  // The folder reads back with its statistics.
  const auto records = read_sweep_dir(dir);
  ASSERT_TRUE(records.ok()) << records.error().message;
  EXPECT_EQ(records.value().items_done, 4);
  EXPECT_EQ(records.value().id, sweep_id(spec));
  const std::string text = sweep_text(records.value());
  EXPECT_NE(text.find("B=2: text changed "), std::string::npos) << text;
  EXPECT_NE(text.find("/4 ("), std::string::npos) << text;

  // Another sweep may not write into this folder; a damaged record is named.
  SweepSpec other = spec;
  other.seeds = {7};
  const auto refused = run_sweep(sweep_session(), other, opt);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("not this one"), std::string::npos);
  std::ofstream(dir / "items" / "item-000001.json") << "{\"format\": 3";
  const auto damaged = run_sweep(sweep_session(), spec, opt);
  ASSERT_FALSE(damaged.ok());
  EXPECT_EQ(damaged.error().code, base::ErrorCode::FileCorrupted);
  EXPECT_NE(damaged.error().message.find("item-000001.json"), std::string::npos);
  fs::remove_all(dir);
}

// Shards of one sweep together hold exactly what one process computes.
TEST(Sweep, ShardsTogetherEqualOneProcess) {
  const SweepSpec spec = tiny_sweep();
  const fs::path one = sweep_dir("one");
  const fs::path split = sweep_dir("split");
  SweepRunOptions opt;
  opt.dir = one;
  auto whole = run_sweep(sweep_session(), spec, opt);
  ASSERT_TRUE(whole.ok());
  std::vector<SweepRow> parts;
  for (int i = 0; i < 3; ++i) {
    SweepRunOptions s;
    s.dir = split;
    s.shard = {i, 3};
    auto part = run_sweep(sweep_session(), spec, s);
    ASSERT_TRUE(part.ok()) << part.error().message;
    parts.insert(parts.end(), part.value().rows.begin(), part.value().rows.end());
  }
  EXPECT_EQ(parts.size(), whole.value().rows.size());
  const auto merged = read_sweep_dir(split);
  ASSERT_TRUE(merged.ok());
  EXPECT_EQ(without_times(merged.value().rows), without_times(whole.value().rows));

  // Each shard's file (as a Slurm task writes it), merged, equals the one-process sweep file.
  std::vector<SweepRecords> files;
  std::vector<std::string> names;
  Provenance elsewhere;
  elsewhere.host = "node-b";
  elsewhere.device_name = "another GPU";
  for (int i = 0; i < 3; ++i) {
    const fs::path f = shard_file(split, i, 3);
    fs::create_directories(f.parent_path());
    Provenance p = whole.value().provenance;
    ASSERT_TRUE(
        io::write_sweep_file(f, shard_records(merged.value(), {i, 3}, i == 2 ? elsewhere : p))
            .ok());
    auto back = io::read_sweep_file(f);
    ASSERT_TRUE(back.ok()) << back.error().message;
    files.push_back(std::move(back).value());
    names.push_back(f.filename().string());
  }
  const auto all = merge_sweeps(files, names);
  ASSERT_TRUE(all.ok()) << all.error().message;
  EXPECT_TRUE(missing_items(all.value()).empty());
  EXPECT_EQ(without_times(all.value().rows), without_times(whole.value().rows));
  EXPECT_EQ(all.value().shards.size(), 3U);
  // A mixed cluster shows: two hosts, the shard of node-b named.
  EXPECT_NE(sweep_text(all.value()).find("computed on"), std::string::npos);
  EXPECT_NE(sweep_text(all.value()).find("3 of 3 (1 items, node-b)"), std::string::npos)
      << sweep_text(all.value());
  // Shards of another sweep, a shard given twice and an item that differs are refused.
  SweepRecords foreign = files[1];
  foreign.spec.seeds = {0, 7};
  foreign.id = sweep_id(foreign.spec);
  const auto mixed = merge_sweeps({files[0], foreign}, {"a.h5", "b.h5"});
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.error().message.find("b.h5 holds sweep"), std::string::npos)
      << mixed.error().message;
  EXPECT_FALSE(merge_sweeps({files[0], files[0]}, {"a.h5", "a2.h5"}).ok());
  SweepRecords changed = files[1];
  changed.shards.clear();
  changed.rows.front().tokens_changed += 1;
  const auto differs = merge_sweeps({files[1], changed}, {"a.h5", "c.h5"});
  ASSERT_FALSE(differs.ok());
  EXPECT_NE(differs.error().message.find("differs between a.h5 and c.h5"), std::string::npos);
  // Two of three shards: the third shard's items are missing.
  const auto two = merge_sweeps({files[0], files[1]}, {"a.h5", "b.h5"});
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(missing_items(two.value()), (std::vector<int>{2}));
  SweepRunOptions bad;
  bad.dir = split;
  bad.shard = {3, 3};
  EXPECT_FALSE(run_sweep(sweep_session(), spec, bad).ok());
  fs::remove_all(one);
  fs::remove_all(split);
}

// Cancelled in the middle: what finished is committed, the next run does the rest.
TEST(Sweep, CancelKeepsFinishedItems) {
  const SweepSpec spec = tiny_sweep();
  const fs::path dir = sweep_dir("cancel");
  base::CancelToken cancel;
  RunControl control;
  control.cancel = &cancel;
  control.progress = [&](const base::Progress& p) {
    if (p.stage.rfind("item 3/", 0) == 0) {
      cancel.cancel();
    }
  };
  SweepRunOptions opt;
  opt.dir = dir;
  const auto stopped = run_sweep(sweep_session(), spec, opt, control);
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(stopped.error().code, base::ErrorCode::Cancelled);
  EXPECT_TRUE(fs::exists(dir / "items" / "item-000001.json"));
  EXPECT_FALSE(fs::exists(dir / "items" / "item-000002.json"));
  auto rest = run_sweep(sweep_session(), spec, opt);
  ASSERT_TRUE(rest.ok());
  EXPECT_EQ(rest.value().items_skipped, 2);
  EXPECT_EQ(rest.value().items_run, 2);
  fs::remove_all(dir);
}

// The job array and merge scripts of --slurm.
TEST(Sweep, SlurmScriptsRunShardsAndMergeAfterThem) {
  SlurmOptions o;
  o.cli = "/opt/bl/batchlens-cli";
  o.sweep_dir = "/shared/my-sweep";
  o.script_dir = "/shared/slurm";
  o.sweep_id = "0123456789abcdef";
  o.shards = 24;
  o.array_parallel = 8;
  o.sbatch_options = {"--partition=gpu", "--time=02:00:00"};
  auto s = slurm_scripts(o);
  ASSERT_TRUE(s.ok()) << s.error().message;
  const std::string& a = s.value().array;
  EXPECT_NE(a.find("#SBATCH --array=0-23%8\n"), std::string::npos) << a;
  EXPECT_NE(a.find("#SBATCH --gres=gpu:1\n"), std::string::npos) << a;
  EXPECT_NE(a.find("#SBATCH --partition=gpu\n#SBATCH --time=02:00:00\n"), std::string::npos);
  EXPECT_NE(a.find("#SBATCH --output=/shared/slurm/logs/shard-%a.out"), std::string::npos);
  EXPECT_NE(a.find("exec /opt/bl/batchlens-cli sweep --resume --out /shared/my-sweep --shard "
                   "\"${SLURM_ARRAY_TASK_ID}/24\""),
            std::string::npos)
      << a;
  EXPECT_NE(
      s.value().merge.find(
          "sweep-merge --out /shared/my-sweep/sweep.h5 /shared/my-sweep/shards/shard-*-of-24.h5"),
      std::string::npos)
      << s.value().merge;
  EXPECT_NE(s.value().submit.find("--dependency=afterok:\"$array\""), std::string::npos);
  o.gpus_per_task = 0;
  o.array_parallel = 0;
  const auto cpu = slurm_scripts(o);
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu.value().array.find("--gres"), std::string::npos);
  EXPECT_NE(cpu.value().array.find("#SBATCH --array=0-23\n"), std::string::npos);
  SlurmOptions bad = o;
  bad.sbatch_options = {"--x\n#SBATCH --y"};
  EXPECT_FALSE(slurm_scripts(bad).ok());
  bad = o;
  bad.shards = 0;
  EXPECT_FALSE(slurm_scripts(bad).ok());
  bad = o;
  bad.sweep_dir = "relative";
  EXPECT_FALSE(slurm_scripts(bad).ok());
  // #SBATCH lines cannot quote: spaces and Slurm's % patterns in paths are refused.
  for (const char* path : {"/shared/my sweep", "/shared/100%", "/shared/a\nb"}) {
    bad = o;
    bad.sweep_dir = path;
    EXPECT_FALSE(slurm_scripts(bad).ok()) << path;
  }
}

// Text of a file, "" when missing.
std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_executable(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
  fs::permissions(p, fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read);
}

// Paths with quotes, $(...) and backticks (spaces and line breaks are refused) and sbatch options
// holding commands reach the programs intact and execute nothing: a canary file must never
// appear. Every script passes bash -n and shellcheck (issue #32).
TEST(Sweep, SlurmScriptsExecuteNothingThatPathsAndOptionsHold) {
  using testing::run_process;
  const fs::path root =
      fs::temp_directory_path() / ("bl-slurm-inject-" + std::to_string(::getpid()));
  fs::remove_all(root);
  const std::string canary = (root / "CANARY").string();
  const std::string evil = "a'b\"c$(touch${IFS}" + canary + ")`touch${IFS}" + canary + "`;d&e|f";
  const fs::path base = root / evil;
  fs::create_directories(base / "bin");
  fs::create_directories(base / "stub");
  // The "CLI" records its arguments, one per line; the stub sbatch records its own and answers
  // with a job id, as `sbatch --parsable` does.
  write_executable(base / "bin" / "cli", "#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$0.args\"\n");
  write_executable(base / "stub" / "sbatch",
                   "#!/bin/sh\nprintf '%s\\n' \"$@\" >> \"$0.args\"\necho 42\n");
  SlurmOptions o;
  o.cli = base / "bin" / "cli";
  o.sweep_dir = base / "sweep";
  o.script_dir = base / "slurm";
  o.sweep_id = "0123456789abcdef";
  o.shards = 4;
  o.sbatch_options = {"--comment=$(touch " + canary + ")", "--comment=`touch " + canary + "`",
                      "--comment='; touch " + canary + "'"};
  ASSERT_TRUE(write_slurm_scripts(o).ok());
  const std::vector<fs::path> scripts{o.script_dir / "sweep-array.sbatch",
                                      o.script_dir / "sweep-merge.sbatch",
                                      o.script_dir / "submit.sh"};
  for (const fs::path& script : scripts) {
    const auto syntax = run_process({"/bin/bash", "-n", script.string()});
    EXPECT_EQ(syntax.exit_code, 0) << script << ": " << syntax.err;
  }

  // Shard 3 of the array and the merge run the CLI with the paths as they are.
  auto r = run_process({"/usr/bin/env", "SLURM_ARRAY_TASK_ID=3", "/bin/bash", scripts[0].string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(slurp(o.cli.string() + ".args"),
            "sweep\n--resume\n--out\n" + o.sweep_dir.string() + "\n--shard\n3/4\n");
  r = run_process({"/bin/bash", scripts[1].string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(slurp(o.cli.string() + ".args"),
            "sweep-merge\n--out\n" + (o.sweep_dir / "sweep.h5").string() + "\n" +
                (o.sweep_dir / "shards").string() + "/shard-*-of-4.h5\n");
  // submit.sh hands sbatch the two scripts by their paths, the merge after the array.
  r = run_process({"/usr/bin/env", "PATH=" + (base / "stub").string() + ":/usr/bin:/bin",
                   "/bin/bash", scripts[2].string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("42 42"), std::string::npos) << r.out;
  EXPECT_EQ(slurp((base / "stub" / "sbatch.args")), "--parsable\n" + scripts[0].string() +
                                                        "\n--parsable\n--dependency=afterok:42\n" +
                                                        scripts[1].string() + "\n");
  EXPECT_FALSE(fs::exists(canary)) << "a path or option was executed";

  // A sweep id read from a folder on disk never reaches the scripts unless it is hexadecimal.
  SlurmOptions bad = o;
  bad.sweep_id = "0123\ntouch " + canary;
  EXPECT_FALSE(slurm_scripts(bad).ok());

  if (run_process({"/bin/sh", "-c", "command -v shellcheck"}).exit_code != 0) {
    fs::remove_all(root);
    // CI installs it (scripts/install-deps.sh): there a missing shellcheck is a failure.
    if (std::getenv("CI") != nullptr) {
      FAIL() << "shellcheck is not installed, and CI must lint the Slurm scripts";
    }
    GTEST_SKIP() << "shellcheck is not installed (scripts/install-deps.sh installs it)";
  }
  // SC2016 ("expressions don't expand in single quotes") is the point: paths are single-quoted
  // so that nothing in them expands.
  std::vector<std::string> check{"/usr/bin/env", "shellcheck", "--shell=bash", "--exclude=SC2016"};
  for (const fs::path& script : scripts) {
    check.push_back(script.string());
  }
  const auto lint = run_process(check);
  EXPECT_EQ(lint.exit_code, 0) << lint.out << lint.err;
  fs::remove_all(root);
}

// What squeue says of a submitted sweep (issue #36): task ranges counted, states sorted into
// pending, running, done and failed; the merge job's state and reason; a jobs file of another
// sweep is none, a damaged one is refused.
TEST(Sweep, SlurmStatusIsReadFromSqueue) {
  const SlurmStatus s = parse_squeue(
      "4-7%2 PENDING JobArrayTaskLimit\n2 RUNNING None\n3 COMPLETING None\n0 COMPLETED None\n"
      "1 FAILED NonZeroExitCode\n8,10-11 CANCELLED None\nnot squeue\n",
      "N/A PENDING Dependency\n");
  EXPECT_TRUE(s.array_known);
  EXPECT_EQ(s.pending, 4);
  EXPECT_EQ(s.running, 2);
  EXPECT_EQ(s.completed, 1);
  EXPECT_EQ(s.failed_tasks, (std::vector<int>{1, 8, 10, 11}));
  EXPECT_EQ(s.failed_states.front(), "FAILED");
  EXPECT_EQ(s.failed_states.back(), "CANCELLED");
  EXPECT_TRUE(s.array_busy());
  EXPECT_EQ(s.merge_state, "PENDING");
  EXPECT_EQ(s.merge_reason, "Dependency");
  // Purged jobs (squeue no longer lists them) are unknown, not done.
  const SlurmStatus gone = parse_squeue("", "");
  EXPECT_FALSE(gone.array_known);
  EXPECT_FALSE(gone.array_busy());
  EXPECT_EQ(gone.merge_state, "");
  // An absurd range is capped, not expanded into billions of tasks.
  EXPECT_LE(parse_squeue("0-99999999999 PENDING None\n", "").pending, 100001);

  const fs::path dir = fs::temp_directory_path() / ("bl_slurm_jobs_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  EXPECT_FALSE(recorded_slurm_jobs(dir, "abc").value().has_value()) << "no jobs file";
  std::ofstream(dir / "jobs.json")
      << R"({"format":"batchlens-slurm-jobs/1","sweep":"abc","array_job":"12","merge_job":"13",)"
      << R"("shards":4})";
  const auto jobs = recorded_slurm_jobs(dir, "abc");
  ASSERT_TRUE(jobs.ok() && jobs.value().has_value());
  EXPECT_EQ(jobs.value()->array_job, "12");
  EXPECT_EQ(jobs.value()->merge_job, "13");
  EXPECT_EQ(jobs.value()->shards, 4);
  EXPECT_FALSE(recorded_slurm_jobs(dir, "other").value().has_value()) << "another sweep's";
  std::ofstream(dir / "jobs.json") << R"({"format":"batchlens-slurm-jobs/1","sweep":"abc",)"
                                   << R"("array_job":"12; rm -rf /","merge_job":"13","shards":4})";
  const auto bad = recorded_slurm_jobs(dir, "abc");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, base::ErrorCode::FileCorrupted);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace batchlens::experiment
