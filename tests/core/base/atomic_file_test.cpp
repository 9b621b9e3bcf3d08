// SPDX-License-Identifier: Apache-2.0
// AtomicFile and AtomicDir: a temporary is never visible without being registered for the
// signal cleanup, so SIGINT/SIGTERM at any moment of a write leaves nothing behind (issue #14;
// the CI once saw `CliRunSafety.SigintWhileWriting...` leave a temporary because the file existed
// a moment before it was registered).
#include "core/base/atomic_file.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

namespace batchlens::base {
namespace {

namespace fs = std::filesystem;

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("bl_atomic_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

int count_temporaries(const fs::path& dir) {
  int n = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    n += it->path().filename().string().find(".tmp-") != std::string::npos ? 1 : 0;
  }
  return n;
}

TEST_F(AtomicFileTest, CommitPutsTheBytesInPlaceAndLeavesNoTemporary) {
  const fs::path target = dir_ / "a.bin";
  {
    AtomicFile f(target);
    EXPECT_TRUE(fs::exists(f.temp_path()));
    EXPECT_EQ(f.temp_path().parent_path(), dir_);
    f.write("hello", 5);
    f.commit();
  }
  std::ifstream in(target, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(s, "hello");
  EXPECT_EQ(count_temporaries(dir_), 0);
  EXPECT_EQ(fs::status(target).permissions() & fs::perms::others_read, fs::perms::others_read);
}

TEST_F(AtomicFileTest, UncommittedWritersLeaveTheOldFileAndNoTemporary) {
  const fs::path target = dir_ / "a.bin";
  ASSERT_TRUE(write_file_atomic(target, "old").ok());
  {
    AtomicFile f(target);
    f.write("new", 3);
  }
  {
    AtomicDir d(dir_ / "folder");
    std::ofstream(d.path() / "x") << "x";
  }
  std::ifstream in(target);
  std::string s;
  in >> s;
  EXPECT_EQ(s, "old");
  EXPECT_EQ(count_temporaries(dir_), 0);
  EXPECT_FALSE(fs::exists(dir_ / "folder"));
}

TEST_F(AtomicFileTest, OrphansOfDeadProcessesAreRemovedAndLiveOnesKept) {
  const fs::path target = dir_ / "a.bin";
  // A pid that cannot be alive (above the kernel's pid_max limit of 2^22).
  std::ofstream(dir_ / "a.bin.tmp-99999999-AbCdEf") << "orphan";
  fs::create_directories(dir_ / "a.bin.tmp-99999998-folder" / "inner");
  const std::string live = "a.bin.tmp-" + std::to_string(::getpid()) + "-Live00";
  std::ofstream(dir_ / live) << "mine";
  EXPECT_EQ(remove_orphaned_temps(target), 2);
  EXPECT_TRUE(fs::exists(dir_ / live));
  EXPECT_EQ(count_temporaries(dir_), 1);
}

// A child writes temporaries in a loop on one thread while another of its threads sends the
// process SIGINT or SIGTERM the moment it sees one on disk; the signal lands on whichever thread
// the kernel picks. Whatever the timing, the child exits 128 + signal and no temporary survives.
void signal_while_temporaries_come_and_go(const fs::path& dir, int sig, bool folders) {
  constexpr int kRounds = 60;
  for (int round = 0; round < kRounds; ++round) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      install_signal_cleanup();
      std::thread watcher([&] {
        for (;;) {
          if (count_temporaries(dir) > 0) {
            ::kill(::getpid(), sig);
          }
        }
      });
      watcher.detach();
      for (;;) {
        if (folders) {
          AtomicDir d(dir / "out");
        } else {
          AtomicFile f(dir / "out.h5");
          f.write("x", 1);
        }
      }
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << "round " << round << ": the child died of signal "
                                   << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    EXPECT_EQ(WEXITSTATUS(status), 128 + sig) << "round " << round;
    ASSERT_EQ(count_temporaries(dir), 0) << "round " << round << " left a temporary";
  }
}

TEST_F(AtomicFileTest, SigintAtAnyMomentOfAWriteLeavesNoTemporaryFile) {
  signal_while_temporaries_come_and_go(dir_, SIGINT, false);
}

TEST_F(AtomicFileTest, SigtermAtAnyMomentOfAWriteLeavesNoTemporaryFolder) {
  signal_while_temporaries_come_and_go(dir_, SIGTERM, true);
}

}  // namespace
}  // namespace batchlens::base
