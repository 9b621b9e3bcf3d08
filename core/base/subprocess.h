// SPDX-License-Identifier: Apache-2.0
// A child process with pipes, run to its end while its stderr lines are handed over as they come
// (issue #36: `ssh` to a GPU server, whose progress arrives as JSON lines). No shell is involved:
// the arguments go to the program as they are. Torch-free.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/base/error.h"

namespace batchlens::base {

/// What to start.
struct ChildSpec {
  std::vector<std::string> argv;      ///< argv[0] is looked up in PATH
  std::string stdin_data;             ///< written to the child's stdin, which is then closed
  std::filesystem::path stdout_file;  ///< set: stdout goes to this file (made 0600, truncated)
};

/// How it ended.
struct ChildOutcome {
  int exit_code = -1;  ///< its exit status; 128 + N when killed by signal N
  std::string out;     ///< its stdout (when not sent to a file), at most 16 MiB kept
  std::string err;     ///< the last 64 KiB of its stderr
};

/// Runs `spec` to its end. Each complete stderr line goes to `on_err_line` as it arrives;
/// `stop` is asked every 100 ms, and once it says true `on_stop` runs (once: e.g. to end the
/// remote side) and the child gets `grace_s` seconds to exit before SIGTERM, then SIGKILL.
/// Errors: IoFailed when the child cannot be started (no such program). Never throws.
Result<ChildOutcome> run_child(const ChildSpec& spec,
                               const std::function<void(const std::string&)>& on_err_line = {},
                               const std::function<bool()>& stop = {},
                               const std::function<void()>& on_stop = {}, double grace_s = 20.0);

}  // namespace batchlens::base
