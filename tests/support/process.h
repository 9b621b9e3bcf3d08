// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <vector>

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

}  // namespace batchlens::testing
