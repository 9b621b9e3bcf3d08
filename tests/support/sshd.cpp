// SPDX-License-Identifier: Apache-2.0
#include "tests/support/sshd.h"

#include <cstdlib>

#include "tests/support/process.h"

namespace batchlens::testing {

namespace {

constexpr const char* kServerScript = BL_SOURCE_DIR "/tests/app/sshd_server.sh";

}  // namespace

std::string start_sshd(const std::filesystem::path& state, bool& skip,
                       const std::string& session_env) {
  skip = false;
  if (!std::filesystem::exists("/usr/sbin/sshd")) {
    if (std::getenv("CI") != nullptr) {
      return "openssh-server is not installed, and CI must run this test "
             "(scripts/install-deps.sh installs it)";
    }
    skip = true;
    return "openssh-server (/usr/sbin/sshd) is not installed";
  }
  const ProcessResult started = run_process({"/usr/bin/env", "BL_SSHD_SETENV=" + session_env,
                                             "/bin/bash", kServerScript, "start", state.string()});
  return started.exit_code == 0 ? std::string() : started.out + started.err;
}

void stop_sshd(const std::filesystem::path& state, const std::filesystem::path& work) {
  // A test's client killed with SIGKILL cannot end its remote run: those runs (by their working
  // folder) and this server's clients go first.
  run_process({"/bin/sh", "-c",
               "for p in $(pgrep -f 'batchlens-cli (run|culprit|sweep) --(spec|sweep)-json'); do "
               "[ \"$(readlink /proc/$p/cwd)\" = '" +
                   work.string() +
                   "' ] && kill -9 $p; done; "
                   "pkill -9 -f -- '-F " +
                   state.string() + "/ssh_config'; true"});
  run_process({"/bin/bash", kServerScript, "stop", state.string()});
}

}  // namespace batchlens::testing
