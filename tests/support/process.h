// SPDX-License-Identifier: Apache-2.0
// Child processes for the tests: run one to completion and capture its output, or keep one
// running in the background (signals, polling its output files).
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <sys/types.h>

namespace batchlens::testing {

/// What a finished child process left behind.
struct ProcessResult {
  int exit_code = -1;  ///< the exit status, or 128 + signal when killed by a signal
  std::string out;     ///< everything it wrote to stdout
  std::string err;     ///< everything it wrote to stderr
};

/// Runs `argv` (argv[0] is a path, no shell) to completion, capturing stdout and stderr.
/// Throws std::runtime_error when the process cannot be started.
ProcessResult run_process(const std::vector<std::string>& argv);

/// The whole content of a file ("" when it cannot be read).
std::string slurp(const std::filesystem::path& p);

/// A child running in the background with extra environment, stdout and stderr to files in
/// `logs`. Killed (SIGKILL) when destroyed while it still runs.
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::vector<std::string>& env,
        const std::filesystem::path& logs);
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  Child(Child&&) = delete;
  Child& operator=(Child&&) = delete;
  ~Child();

  bool running();
  void signal(int sig) const;
  /// The exit status (128 + signal when killed), or -1 after `timeout` (the child is killed).
  int wait(std::chrono::seconds timeout = std::chrono::seconds(300));
  /// Waits until its stderr contains `text` while it runs (at most `timeout`); true when seen.
  bool wait_for_err(const std::string& text,
                    std::chrono::seconds timeout = std::chrono::seconds(240));
  std::string out() const { return slurp(out_); }
  std::string err() const { return slurp(err_); }

 private:
  pid_t pid_ = -1;
  int status_ = -1;
  std::filesystem::path out_;
  std::filesystem::path err_;
};

}  // namespace batchlens::testing
