// SPDX-License-Identifier: Apache-2.0
// A real single-node Slurm cluster for the tests (issues #19, #36): tests/app/slurm_cluster.sh
// (Debian's slurm-wlm and munge, everything under a temporary folder) started as root, directly
// or through passwordless sudo, and stopped by the destructor with the jobs it still holds.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace batchlens::testing {

class SlurmCluster {
 public:
  /// The cluster's files go under `state` (made; removed by the destructor).
  explicit SlurmCluster(std::filesystem::path state) : state_(std::move(state)) {}
  ~SlurmCluster();
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;
  SlurmCluster(SlurmCluster&&) = delete;
  SlurmCluster& operator=(SlurmCluster&&) = delete;

  /// Why a cluster cannot start on this machine (not root and no passwordless sudo: slurmd starts
  /// jobs as their user; slurm-wlm or munge missing), "" when it can.
  std::string unavailable();
  /// Starts it; "" when its node is idle, else what the script said.
  std::string start();
  /// Its slurm.conf: clients (sbatch, squeue, scancel) reach it with SLURM_CONF set to this.
  std::filesystem::path conf() const { return state_ / "slurm.conf"; }

 private:
  std::filesystem::path state_;
  std::vector<std::string> as_root_;  ///< the sudo prefix, empty when this process is root
  bool started_ = false;
};

}  // namespace batchlens::testing
