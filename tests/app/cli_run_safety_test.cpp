// SPDX-License-Identifier: Apache-2.0
// `batchlens-cli run` never loses a computed experiment and never leaves a half file: what it
// refuses before the run, what a signal during the write leaves, where a late write failure puts
// the result (issue #14).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/io/experiment_file.h"
#include "tests/support/process.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace batchlens {
namespace {

namespace fs = std::filesystem;
using testing::Child;
using testing::run_process;
using Clock = std::chrono::steady_clock;

// A fresh folder per test, removed at the end.
class CliRunSafety : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("bl_cli_safety_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    for (const auto& m : mounts_) {
      ::umount2(m.c_str(), MNT_DETACH);
    }
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }

  // Mounts a tmpfs of `size` ("1m") with `options` at dir_/name; false where this machine does
  // not allow it (not root, a container without CAP_SYS_ADMIN).
  bool mount_tmpfs(const std::string& name, const std::string& size, unsigned long flags = 0) {
    const fs::path at = dir_ / name;
    fs::create_directories(at);
    const std::string data = "size=" + size + ",mode=0755";
    if (::mount("tmpfs", at.c_str(), "tmpfs", flags, data.c_str()) != 0) {
      return false;
    }
    mounts_.push_back(at);
    return true;
  }

  fs::path dir_;
  std::vector<fs::path> mounts_;
};

std::vector<std::string> tiny_run(const fs::path& out) {
  return {BL_CLI_PATH,     "run",       "--preset",         "tiny",
          "--steps",       "3",         "--max-new-tokens", "16",
          "--batch-sizes", "2",         "--policy",         "emulated_split_k",
          "--out",         out.string()};
}

bool has_temporary(const fs::path& dir) {
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename().string().find(".tmp-") != std::string::npos) {
      return true;
    }
  }
  return false;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Waits until a temporary of the experiment file exists in `dir` while the child runs.
bool wait_for_temporary(Child& child, const fs::path& dir) {
  const auto end = Clock::now() + std::chrono::seconds(240);
  while (Clock::now() < end && child.running()) {
    if (has_temporary(dir)) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// The path the CLI says it saved the result to, or empty.
fs::path rescued_path(const std::string& err) {
  std::smatch m;
  const std::regex saved("saved to (\\S+batchlens-rescued-\\S+\\.h5) instead");
  return std::regex_search(err, m, saved) ? fs::path(m[1].str()) : fs::path();
}

TEST_F(CliRunSafety, InvalidUtf8PromptIsRefusedBeforeAnyComputation) {
  const fs::path out = dir_ / "e.h5";
  auto argv = tiny_run(out);
  argv.insert(argv.begin() + 4, {"--prompt", std::string("caf\xC3\xA9 \xFF\xFE bad")});
  const auto r = run_process(argv);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--prompt is not valid UTF-8 (byte 6"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("\r["), std::string::npos) << "no progress: nothing was computed";
  EXPECT_TRUE(fs::is_empty(dir_));
  // Valid multi-byte UTF-8 passes the same check.
  auto ok = tiny_run(out);
  ok.insert(ok.begin() + 4, {"--prompt", std::string("caf\xC3\xA9 \xE2\x82\xAC")});
  const auto good = run_process(ok);
  EXPECT_EQ(good.exit_code, 0) << good.err;
  EXPECT_TRUE(fs::exists(out));
}

// issue #35: a companions file from elsewhere is refused with its reason before any run (an
// empty file, invalid UTF-8, a 100 MB line, a prompt too long for the model's context); a good
// one runs a mixed batch and the file says so.
TEST_F(CliRunSafety, BadCompanionsFilesAreRefusedBeforeAnyComputation) {
  const fs::path out = dir_ / "e.h5";
  const fs::path files =
      fs::path(::testing::TempDir()) / ("bl_companions_" + std::to_string(::getpid()));
  fs::create_directories(files);
  const auto refused = [&](const std::string& name, const std::string& reason) {
    auto argv = tiny_run(out);
    argv.insert(argv.begin() + 4, {"--companions", (files / name).string()});
    const auto r = run_process(argv);
    EXPECT_NE(r.exit_code, 0) << name;
    EXPECT_NE(r.err.find(reason), std::string::npos) << name << ": " << r.err;
    EXPECT_EQ(r.err.find("\r["), std::string::npos) << name << ": nothing was computed";
    EXPECT_TRUE(fs::is_empty(dir_)) << name;
  };
  std::ofstream(files / "empty.txt") << "\n \n";
  refused("empty.txt", "companions file");
  std::ofstream(files / "utf8.txt", std::ios::binary) << "fine\ncaf\xC3 broken\n";
  refused("utf8.txt", "line 2 is not valid UTF-8");
  {
    std::ofstream big(files / "huge.txt", std::ios::binary);
    const std::string chunk(1 << 20, 'a');
    for (int i = 0; i < 100; ++i) {
      big << chunk;
    }
    big << "\n";
  }
  refused("huge.txt", "at most");
  {
    std::ofstream longer(files / "long.jsonl");
    longer << R"({"prompt": "short"})"
           << "\n"
           << R"({"prompt_ids": [)";
    for (int i = 0; i < 9000; ++i) {
      longer << (i ? "," : "") << 7;
    }
    longer << "]}\n";
  }
  refused("long.jsonl", "companion 2 is too long for the model's context");
  std::ofstream(files / "good.txt") << "Explain tides in one long sentence, please.\nHi\n";
  auto argv = tiny_run(out);
  argv.insert(argv.begin() + 4, {"--companions", (files / "good.txt").string(), "--row", "1",
                                 "--positions", "per_row"});
  *(std::find(argv.begin(), argv.end(), "--batch-sizes") + 1) = "2,3";
  const auto good = run_process(argv);
  ASSERT_EQ(good.exit_code, 0) << good.err;
  const auto file = io::read_experiment(out);
  ASSERT_TRUE(file.ok()) << file.error().message;
  const experiment::Composition& c = file.value().spec.composition;
  ASSERT_EQ(c.companions.size(), 2U);
  EXPECT_EQ(c.companions[1].text, "Hi");
  EXPECT_EQ(c.row, 1);
  EXPECT_EQ(c.positions, generation::PositionMode::PerRow);
  EXPECT_EQ(file.value().spec.prefill, generation::PrefillMode::Batched);
  const auto summary = run_process({BL_CLI_PATH, "summary", out.string()});
  EXPECT_NE(summary.out.find("batch rows: the prompt in row 1 beside 2 companions"),
            std::string::npos)
      << summary.out;
  fs::remove_all(files);
}

TEST_F(CliRunSafety, BadOutIsRefusedBeforeTheRun) {
  // A folder that does not exist.
  const auto missing = run_process(tiny_run(dir_ / "no" / "such" / "e.h5"));
  EXPECT_EQ(missing.exit_code, 2) << missing.err;
  EXPECT_NE(missing.err.find("No such file or directory"), std::string::npos) << missing.err;
  EXPECT_EQ(missing.err.find("\r["), std::string::npos) << missing.err;
  // --out names a folder.
  fs::create_directories(dir_ / "folder.h5");
  const auto folder = run_process(tiny_run(dir_ / "folder.h5"));
  EXPECT_EQ(folder.exit_code, 2) << folder.err;
  EXPECT_NE(folder.err.find("is a folder"), std::string::npos) << folder.err;
  // --out is a FIFO: refused without opening it (which would block).
  ASSERT_EQ(::mkfifo((dir_ / "pipe.h5").c_str(), 0644), 0);
  const auto fifo = run_process(tiny_run(dir_ / "pipe.h5"));
  EXPECT_EQ(fifo.exit_code, 2) << fifo.err;
  EXPECT_NE(fifo.err.find("FIFO"), std::string::npos) << fifo.err;
  // The folder of --out is a file.
  std::ofstream(dir_ / "plain").put('x');
  const auto file_parent = run_process(tiny_run(dir_ / "plain" / "e.h5"));
  EXPECT_EQ(file_parent.exit_code, 2) << file_parent.err;
  EXPECT_FALSE(has_temporary(dir_));
}

TEST_F(CliRunSafety, NonWritableOutFolderIsRefusedBeforeTheRun) {
  fs::path folder = dir_ / "ro";
  if (::geteuid() == 0) {
    // Permission bits do not stop root; a read-only file system does.
    if (!mount_tmpfs("ro", "1m", MS_RDONLY)) {
      GTEST_SKIP() << "running as root and cannot mount a read-only tmpfs here";
    }
  } else {
    fs::create_directories(folder);
    fs::permissions(folder, fs::perms::owner_read | fs::perms::owner_exec);
  }
  const auto r = run_process(tiny_run(folder / "e.h5"));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("cannot create files in"), std::string::npos) << r.err;
  EXPECT_TRUE(r.err.find("Read-only file system") != std::string::npos ||
              r.err.find("Permission denied") != std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("\r["), std::string::npos) << r.err;
}

TEST_F(CliRunSafety, TooLittleSpaceIsRefusedBeforeTheRun) {
  if (!mount_tmpfs("small", "16k")) {
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN)";
  }
  const auto r = run_process(tiny_run(dir_ / "small" / "e.h5"));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("not enough space"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("\r["), std::string::npos) << r.err;
}

void expect_signal_during_write_leaves_nothing(const fs::path& dir, int sig, int expected) {
  const fs::path out = dir / "e.h5";
  Child child(tiny_run(out), {"BATCHLENS_TEST_WRITE_PAUSE_MS=20000"}, dir.parent_path());
  ASSERT_TRUE(wait_for_temporary(child, dir))
      << "no temporary appeared while writing (BATCHLENS_TEST_WRITE_PAUSE_MS hook missing?)\n"
      << child.err();
  child.signal(sig);
  EXPECT_EQ(child.wait(), expected) << child.err();
  EXPECT_FALSE(has_temporary(dir));
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(CliRunSafety, SigintWhileWritingExits130AndLeavesNoTemporary) {
  fs::create_directories(dir_ / "w");
  expect_signal_during_write_leaves_nothing(dir_ / "w", SIGINT, 130);
}

TEST_F(CliRunSafety, SigtermWhileWritingExits143AndLeavesNoTemporary) {
  fs::create_directories(dir_ / "w");
  expect_signal_during_write_leaves_nothing(dir_ / "w", SIGTERM, 143);
}

TEST_F(CliRunSafety, SigtermDuringTheRunExits143AndLeavesNothing) {
  const fs::path out = dir_ / "w" / "e.h5";
  fs::create_directories(out.parent_path());
  Child child({BL_CLI_PATH, "run", "--preset", "demo", "--steps", "48", "--max-new-tokens", "1024",
               "--out", out.string()},
              {}, dir_);
  // Once the progress bar shows, the run is under way.
  const auto end = Clock::now() + std::chrono::seconds(240);
  while (child.running() && Clock::now() < end && child.err().find("\r[") == std::string::npos) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(child.running()) << child.err();
  child.signal(SIGTERM);
  EXPECT_EQ(child.wait(), 143) << child.err();
  EXPECT_TRUE(fs::is_empty(out.parent_path()));
}

// The result must survive a write that fails after the checks passed. Here --out turns into a
// folder while the writer holds its temporary, so the rename into place fails (EISDIR).
TEST_F(CliRunSafety, LateWriteFailureRescuesTheResult) {
  const fs::path out = dir_ / "w" / "e.h5";
  const fs::path rescue = dir_ / "rescue";
  fs::create_directories(out.parent_path());
  fs::create_directories(rescue);
  Child child(tiny_run(out), {"BATCHLENS_TEST_WRITE_PAUSE_MS=3000", "TMPDIR=" + rescue.string()},
              dir_);
  ASSERT_TRUE(wait_for_temporary(child, out.parent_path())) << child.err();
  fs::create_directories(out / "in-the-way");
  const int rc = child.wait();
  const std::string err = child.err();
  EXPECT_EQ(rc, 1) << err;
  EXPECT_NE(err.find("Is a directory"), std::string::npos) << err;
  EXPECT_NE(err.find(out.string()), std::string::npos) << err;
  const fs::path saved = rescued_path(err);
  ASSERT_FALSE(saved.empty()) << err;
  EXPECT_EQ(saved.parent_path(), fs::weakly_canonical(rescue));
  EXPECT_NE(child.out().find("ref__b2"), std::string::npos) << "the summary is still printed";
  const auto back = run_process({BL_CLI_PATH, "summary", saved.string(), "--json"});
  ASSERT_EQ(back.exit_code, 0) << back.err;
  EXPECT_EQ(nlohmann::json::parse(back.out)["comparisons"].size(), 2U);
  EXPECT_FALSE(has_temporary(out.parent_path()));
  EXPECT_FALSE(has_temporary(rescue));
}

// A disk that fills during the write: the writer's ENOSPC is named and the result rescued.
TEST_F(CliRunSafety, DiskFullDuringTheWriteRescuesTheResult) {
  if (!mount_tmpfs("fs", "4m")) {
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN)";
  }
  const fs::path out = dir_ / "fs" / "e.h5";
  const fs::path rescue = dir_ / "rescue";
  fs::create_directories(rescue);
  Child child(tiny_run(out), {"BATCHLENS_TEST_WRITE_PAUSE_MS=3000", "TMPDIR=" + rescue.string()},
              dir_);
  ASSERT_TRUE(wait_for_temporary(child, out.parent_path())) << child.err();
  {
    // Fill the file system to the last byte.
    std::ofstream filler(dir_ / "fs" / "filler", std::ios::binary);
    const std::string block(4096, 'x');
    while (filler.write(block.data(), static_cast<std::streamsize>(block.size())) &&
           filler.flush()) {
    }
  }
  const int rc = child.wait();
  const std::string err = child.err();
  EXPECT_EQ(rc, 1) << err;
  EXPECT_NE(err.find("No space left on device"), std::string::npos) << err;
  const fs::path saved = rescued_path(err);
  ASSERT_FALSE(saved.empty()) << err;
  const auto back = run_process({BL_CLI_PATH, "summary", saved.string(), "--json"});
  ASSERT_EQ(back.exit_code, 0) << back.err;
  EXPECT_EQ(nlohmann::json::parse(back.out)["comparisons"].size(), 2U);
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(has_temporary(dir_ / "fs"));
}

// issue #19: a sweep killed with SIGKILL in the middle (no handler runs) loses no finished item;
// the same command again runs only the rest, rewrites nothing finished, and writes the sweep file.
TEST_F(CliRunSafety, SweepKilledMidwayResumesWithoutLosingOrRepeatingAnItem) {
  std::ofstream(dir_ / "prompts.txt") << "Write about Lisbon.\nExplain tides.\nName a colour.\n";
  const fs::path sweep = dir_ / "sweep";
  const std::vector<std::string> argv{BL_CLI_PATH,
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
                                      "0-1",
                                      "--out",
                                      sweep.string()};
  std::vector<fs::path> done;
  {
    Child child(argv, {}, dir_);
    const auto end = Clock::now() + std::chrono::seconds(300);
    // Killed once at least two items are committed and the third runs.
    while (Clock::now() < end && child.running() &&
           !fs::exists(sweep / "items" / "item-000001.json")) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(child.running()) << "the sweep ended before it could be killed: " << child.err();
    child.signal(SIGKILL);
    EXPECT_EQ(child.wait(), 128 + SIGKILL);
  }
  std::map<fs::path, std::pair<std::string, fs::file_time_type>> before;
  for (const auto& e : fs::directory_iterator(sweep / "items")) {
    if (e.path().extension() == ".json") {
      before[e.path()] = {slurp(e.path()), fs::last_write_time(e.path())};
    }
  }
  ASSERT_GE(before.size(), 2U);
  ASSERT_LT(before.size(), 6U) << "killed after the last item";
  EXPECT_FALSE(fs::exists(sweep / "sweep.h5"));
  const auto again = run_process(argv);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  const std::string line = std::to_string(6 - before.size()) + " item(s) run, " +
                           std::to_string(before.size()) + " finished before and skipped";
  EXPECT_NE(again.out.find(line), std::string::npos) << again.out;
  for (const auto& [path, kept] : before) {
    EXPECT_EQ(slurp(path), kept.first) << path;
    EXPECT_EQ(fs::last_write_time(path), kept.second) << path << " was rewritten";
  }
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(fs::exists(sweep / "items" / ("item-00000" + std::to_string(i) + ".json"))) << i;
  }
  EXPECT_FALSE(has_temporary(sweep));
  const auto summary =
      run_process({BL_CLI_PATH, "summary", "--json", (sweep / "sweep.h5").string()});
  ASSERT_EQ(summary.exit_code, 0) << summary.err;
  const auto j = nlohmann::json::parse(summary.out);
  EXPECT_EQ(j.at("items_done").get<int>(), 6);
  EXPECT_EQ(j.at("rows").size(), 6U);
  // --resume takes the spec from the folder; an option that would change it is refused.
  const auto resumed = run_process({BL_CLI_PATH, "sweep", "--resume", "--out", sweep.string()});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("0 item(s) run, 6 finished before and skipped"), std::string::npos);
  const auto changed = run_process(
      {BL_CLI_PATH, "sweep", "--resume", "--out", sweep.string(), "--batch-sizes", "8"});
  EXPECT_EQ(changed.exit_code, 2);
  EXPECT_NE(changed.err.find("--batch-sizes cannot change it"), std::string::npos) << changed.err;
}

}  // namespace
}  // namespace batchlens
