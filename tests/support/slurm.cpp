// SPDX-License-Identifier: Apache-2.0
#include "tests/support/slurm.h"

#include <system_error>

#include "tests/support/process.h"

#include <unistd.h>

namespace batchlens::testing {

namespace {

constexpr const char* kClusterScript = BL_SOURCE_DIR "/tests/app/slurm_cluster.sh";

}  // namespace

std::string SlurmCluster::unavailable() {
  if (::geteuid() != 0) {
    if (run_process({"/usr/bin/sudo", "-n", "/bin/true"}).exit_code != 0) {
      // CI installs slurm-wlm and munge with scripts/install-deps.sh, which needs root or
      // passwordless sudo on a fresh machine; the tests then run there.
      return "slurmd starts jobs as their user and must run as root; this test is not root and "
             "has no passwordless sudo";
    }
    as_root_ = {"/usr/bin/sudo", "-n"};
  }
  if (run_process({"/bin/sh", "-c", "command -v slurmctld && command -v munged"}).exit_code != 0) {
    // CI installs slurm-wlm and munge (scripts/install-deps.sh, which fails the run otherwise);
    // a GPU server may not have them.
    return "slurm-wlm or munge is not installed";
  }
  return {};
}

std::string SlurmCluster::start() {
  started_ = true;  // stopped at the end even when it did not start whole
  std::vector<std::string> argv = as_root_;
  argv.insert(argv.end(), {"/bin/bash", kClusterScript, "start", state_.string()});
  const ProcessResult r = run_process(argv);
  return r.exit_code == 0 ? std::string() : r.out + r.err;
}

SlurmCluster::~SlurmCluster() {
  if (!started_) {
    return;
  }
  std::vector<std::string> argv = as_root_;
  argv.insert(argv.end(), {"/bin/bash", kClusterScript, "stop", state_.string()});
  run_process(argv);
  if (!as_root_.empty()) {  // the daemons' files belong to root
    run_process({"/usr/bin/sudo", "-n", "/bin/rm", "-rf", state_.string()});
  }
  std::error_code ec;
  std::filesystem::remove_all(state_, ec);
}

}  // namespace batchlens::testing
