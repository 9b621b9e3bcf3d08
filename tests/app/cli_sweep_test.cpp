// SPDX-License-Identifier: Apache-2.0
// issue #19: a sweep fanned out on a real Slurm cluster (Debian's slurm-wlm and munge, started on
// this machine by tests/app/slurm_cluster.sh and stopped at the end) gives the same sweep file as
// the sweep run in one process; sweep-merge refuses shards of another sweep.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/process.h"
#include "tests/support/slurm.h"

#include <sys/stat.h>
#include <unistd.h>

namespace batchlens {
namespace {

namespace fs = std::filesystem;
using testing::run_process;

class CliSweep : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("bl_cli_sweep_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "prompts.txt") << "Write about Lisbon.\nExplain tides.\n";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // The tiny sweep: 2 prompts x 2 seeds, B=2, emulated split-K (texts change), into `out`.
  std::vector<std::string> tiny_sweep(const fs::path& out, const std::string& seeds = "0-1") const {
    return {BL_CLI_PATH,
            "sweep",
            "--preset",
            "tiny",
            "--steps",
            "3",
            "--max-new-tokens",
            "16",
            "--batch-sizes",
            "2",
            "--policy",
            "emulated_h200",
            "--prompts",
            (dir_ / "prompts.txt").string(),
            "--seeds",
            seeds,
            "--out",
            out.string()};
  }

  fs::path dir_;
};

// What two computations of a sweep agree on: its statistics and rows without wall times, where
// they ran and how they were split.
nlohmann::json outcome(const fs::path& sweep_file) {
  const auto r = run_process({BL_CLI_PATH, "summary", "--json", sweep_file.string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  for (auto& row : j.at("rows")) {
    row.erase("wall_s");
    row.erase("provenance");
  }
  j.erase("provenances");
  j.erase("shards");
  return j;
}

// A FIFO given as --prompts is refused at once instead of blocking on its read (issue #32).
// Issue #35: the companions and the row under test as axes of a sweep, counted per value.
TEST_F(CliSweep, CompanionSetsAndRowsAreAxes) {
  {
    std::ofstream c(dir_ / "companions.txt");
    c << "Explain how a lighthouse works, and why its light turns.\n";
  }
  const auto r = run_process({BL_CLI_PATH,
                              "sweep",
                              "--preset",
                              "tiny",
                              "--prompt",
                              "Tides?",
                              "--seeds",
                              "0",
                              "--batch-sizes",
                              "2",
                              "--steps",
                              "2",
                              "--max-new-tokens",
                              "16",
                              "--companion-sets",
                              "none," + (dir_ / "companions.txt").string(),
                              "--rows",
                              "0,1",
                              "--out",
                              (dir_ / "axes").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto text = run_process({BL_CLI_PATH, "summary", (dir_ / "axes" / "sweep.h5").string()});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("batch rows: 2 set(s) of companions (identical rows, companions 2 (1 "
                          "prompt)) x row(s) under test 0 1, positions shared"),
            std::string::npos)
      << text.out;
  for (const char* line :
       {"B=2, identical rows, row 0: text changed", "B=2, identical rows, row 1",
        "B=2, companions 2 (1 prompt), row 0", "B=2, companions 2 (1 prompt), row 1"}) {
    EXPECT_NE(text.out.find(line), std::string::npos) << line << "\n" << text.out;
  }
  const auto bad = run_process({BL_CLI_PATH, "sweep", "--preset", "tiny", "--rows", "0,x", "--out",
                                (dir_ / "bad").string()});
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--rows"), std::string::npos) << bad.err;
  const auto far = run_process(
      {BL_CLI_PATH, "sweep", "--preset", "tiny", "--batch-sizes", "2", "--rows", "0,2",
       "--companion-sets", (dir_ / "companions.txt").string(), "--out", (dir_ / "far").string()});
  EXPECT_NE(far.exit_code, 0);
  EXPECT_NE(far.err.find("row"), std::string::npos) << far.err;
  // Per-row positions over the axis (the companions come with it, not --companions): accepted,
  // run, and named in the summary (they were refused, then lost in sweep.json).
  const auto per_row = run_process(
      {BL_CLI_PATH, "sweep", "--preset", "tiny", "--prompt", "Tides?", "--batch-sizes", "2",
       "--steps", "2", "--max-new-tokens", "16", "--positions", "per_row", "--companion-sets",
       "none," + (dir_ / "companions.txt").string(), "--out", (dir_ / "per_row").string()});
  ASSERT_EQ(per_row.exit_code, 0) << per_row.err;
  const auto per_row_text = run_process({BL_CLI_PATH, "summary", (dir_ / "per_row").string()});
  EXPECT_NE(per_row_text.out.find("positions per_row"), std::string::npos) << per_row_text.out;
  // Without companions anywhere, per_row is still refused before any work.
  const auto alone = run_process({BL_CLI_PATH, "sweep", "--preset", "tiny", "--positions",
                                  "per_row", "--out", (dir_ / "alone").string()});
  EXPECT_EQ(alone.exit_code, 2) << alone.err;
  EXPECT_NE(alone.err.find("give companions"), std::string::npos) << alone.err;
}

TEST_F(CliSweep, PromptsFromAFifoAreRefusedWithoutBlocking) {
  const fs::path fifo = dir_ / "prompts.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  const auto r =
      run_process({BL_CLI_PATH, "sweep", "--preset", "tiny", "--prompts", fifo.string(), "--seeds",
                   "0", "--batch-sizes", "2", "--out", (dir_ / "sweep").string()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("FIFO"), std::string::npos) << r.err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST_F(CliSweep, SlurmJobArrayOnARealClusterEqualsOneProcess) {
  testing::SlurmCluster cluster(dir_ / "cluster");
  if (const std::string why = cluster.unavailable(); !why.empty()) {
    GTEST_SKIP() << why;
  }
  // The same sweep in one process.
  const fs::path one = dir_ / "one";
  const auto whole = run_process(tiny_sweep(one));
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  ASSERT_TRUE(fs::exists(one / "sweep.h5"));

  // The job array: 4 shards, at most 2 at once, no GPU on this node.
  const fs::path split = dir_ / "split";
  auto argv = tiny_sweep(split);
  argv.insert(argv.end(),
              {"--slurm", (dir_ / "slurm").string(), "--shards", "4", "--array-parallel", "2",
               "--gpus-per-task", "0", "--sbatch-option", "--time=00:20:00"});
  const auto wrote = run_process(argv);
  ASSERT_EQ(wrote.exit_code, 0) << wrote.err;
  std::ifstream in(dir_ / "slurm" / "sweep-array.sbatch");
  std::stringstream array;
  array << in.rdbuf();
  EXPECT_NE(array.str().find("#SBATCH --array=0-3%2"), std::string::npos) << array.str();
  EXPECT_NE(array.str().find("#SBATCH --time=00:20:00"), std::string::npos) << array.str();
  EXPECT_NE(array.str().find("--shard \"${SLURM_ARRAY_TASK_ID}/4\""), std::string::npos);
  EXPECT_FALSE(fs::exists(split / "items" / "item-000000.json")) << "--slurm runs nothing";

  ASSERT_EQ(cluster.start(), "");
  const std::string conf = cluster.conf().string();
  ::setenv("SLURM_CONF", conf.c_str(), 1);
  const auto submitted = run_process({(dir_ / "slurm" / "submit.sh").string()});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.out << submitted.err;
  std::istringstream last(
      submitted.out.substr(submitted.out.rfind('\n', submitted.out.size() - 2) + 1));
  std::string array_job;
  std::string merge_job;
  last >> array_job >> merge_job;
  ASSERT_FALSE(merge_job.empty()) << submitted.out;

  // Waits for the merge job (it runs after every array task succeeded).
  std::string state;
  const auto end = std::chrono::steady_clock::now() + std::chrono::minutes(10);
  while (std::chrono::steady_clock::now() < end) {
    const auto q = run_process({"/usr/bin/scontrol", "show", "job", merge_job});
    const auto at = q.out.find("JobState=");
    state = at == std::string::npos ? q.out + q.err
                                    : q.out.substr(at + 9, q.out.find(' ', at) - at - 9);
    if (state == "COMPLETED" || state == "FAILED" || state == "CANCELLED" || state == "TIMEOUT" ||
        state.find("DEPENDENCY") != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  std::ifstream merge_log(dir_ / "slurm" / "logs" / "merge.out");
  std::stringstream log;
  log << merge_log.rdbuf();
  ASSERT_EQ(state, "COMPLETED") << log.str();
  ::unsetenv("SLURM_CONF");
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(fs::exists(split / "shards" / ("shard-" + std::to_string(i) + "-of-4.h5"))) << i;
  }
  ASSERT_TRUE(fs::exists(split / "sweep.h5")) << log.str();
  EXPECT_EQ(outcome(split / "sweep.h5"), outcome(one / "sweep.h5"));
  // The merged file holds its four shards.
  const auto summary = run_process({BL_CLI_PATH, "summary", (split / "sweep.h5").string()});
  EXPECT_NE(summary.out.find("shards: 1 of 4"), std::string::npos) << summary.out;
  EXPECT_NE(summary.out.find("4 of 4"), std::string::npos) << summary.out;
  // The sweep run in one process is not sharded: no "shards: 0/1" (issue #34).
  const auto single = run_process({BL_CLI_PATH, "summary", (one / "sweep.h5").string()});
  EXPECT_EQ(single.exit_code, 0) << single.err;
  EXPECT_EQ(single.out.find("shards"), std::string::npos) << single.out;

  // A shard of another sweep (other seeds) is refused; nothing is written.
  const fs::path other = dir_ / "other";
  auto foreign = tiny_sweep(other, "5");
  foreign.insert(foreign.end(), {"--shard", "0/4"});
  ASSERT_EQ(run_process(foreign).exit_code, 0);
  const auto refused = run_process(
      {BL_CLI_PATH, "sweep-merge", (split / "shards" / "shard-1-of-4.h5").string(),
       (other / "shards" / "shard-0-of-4.h5").string(), "--out", (dir_ / "mixed.h5").string()});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("not merged"), std::string::npos) << refused.err;
  EXPECT_FALSE(fs::exists(dir_ / "mixed.h5"));
  // Shards with items missing are refused unless asked.
  const auto partial =
      run_process({BL_CLI_PATH, "sweep-merge", (split / "shards" / "shard-1-of-4.h5").string(),
                   "--out", (dir_ / "partial.h5").string()});
  EXPECT_EQ(partial.exit_code, 1);
  EXPECT_NE(partial.err.find("3 of 4 items have no rows"), std::string::npos) << partial.err;
  EXPECT_FALSE(fs::exists(dir_ / "partial.h5"));
}

// issue #36: --slurm --wait on a login node follows the jobs; a task that fails is a clear error
// naming the task and its log's last line, the merge job is cancelled, and the same command
// after the fix submits again and finishes (the items done are not run twice).
TEST_F(CliSweep, SlurmWaitReportsAFailedTaskAndTheSameCommandFinishes) {
  testing::SlurmCluster cluster(dir_ / "cluster");
  if (const std::string why = cluster.unavailable(); !why.empty()) {
    GTEST_SKIP() << why;
  }
  ASSERT_EQ(cluster.start(), "");
  ::setenv("SLURM_CONF", cluster.conf().c_str(), 1);
  const fs::path sweep = dir_ / "sweep";
  auto argv = tiny_sweep(sweep);
  argv.insert(argv.end(),
              {"--slurm", (dir_ / "slurm").string(), "--shards", "2", "--array-parallel", "1",
               "--gpus-per-task", "0", "--wait", "--poll-s", "0.3", "--progress", "json"});
  fs::create_directories(dir_ / "logs");
  {
    testing::Child child(argv, {}, dir_ / "logs");
    ASSERT_TRUE(child.wait_for_err("Slurm job ")) << child.err();
    // A damaged record (of item 1, which shard 1 runs after shard 0) makes the folder unreadable
    // when the tasks write their shard files: they fail once their items are done.
    std::ofstream(sweep / "items" / "item-000001.json") << "{ not json";
    EXPECT_EQ(child.wait(std::chrono::seconds(240)), 1) << child.err();
    EXPECT_NE(child.err().find("of 2 array tasks of job"), std::string::npos) << child.err();
    EXPECT_NE(child.err().find(" FAILED"), std::string::npos) << child.err();
    EXPECT_NE(child.err().find("item-000001.json is not valid JSON"), std::string::npos)
        << child.err();
    EXPECT_NE(child.err().find("the same command submits only the rest"), std::string::npos);
  }
  EXPECT_FALSE(fs::exists(sweep / "sweep.h5"));
  const std::string first_jobs = testing::slurp(dir_ / "slurm" / "jobs.json");
  // Fixed, the same command submits again (the first merge job was cancelled) and finishes.
  fs::remove(sweep / "items" / "item-000001.json");
  const auto again = run_process(argv);
  ASSERT_EQ(again.exit_code, 0) << again.out << again.err;
  EXPECT_NE(again.out.find("submitted: job array"), std::string::npos) << again.out;
  EXPECT_NE(testing::slurp(dir_ / "slurm" / "jobs.json"), first_jobs);
  EXPECT_NE(again.err.find("\"event\":\"written\""), std::string::npos) << again.err;
  const auto summary = run_process({BL_CLI_PATH, "summary", (sweep / "sweep.h5").string()});
  EXPECT_NE(summary.out.find("items finished: 4 of 4"), std::string::npos) << summary.out;
  // The shard that ran before kept its items: shard 0's log says it skipped them.
  EXPECT_NE(testing::slurp(dir_ / "slurm" / "logs" / "shard-0.out").find("finished before"),
            std::string::npos);
  ::unsetenv("SLURM_CONF");
}

}  // namespace
}  // namespace batchlens
