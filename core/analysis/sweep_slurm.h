// SPDX-License-Identifier: Apache-2.0
// A sweep fanned out on a Slurm cluster (issue #19): a job array with one task per shard, each
// running `batchlens-cli sweep --resume --out DIR --shard I/N` into its own shard file, and a
// merge job that depends on it (afterok) and runs `batchlens-cli sweep-merge`. BatchLens writes
// the scripts; Slurm schedules them. Torch-free.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "core/base/error.h"

namespace batchlens::analysis {

struct SlurmOptions {
  std::filesystem::path cli;         ///< the batchlens-cli the tasks run (absolute)
  std::filesystem::path sweep_dir;   ///< the sweep's folder, on storage every node sees (absolute)
  std::filesystem::path script_dir;  ///< where the scripts and logs/ go (absolute)
  std::string sweep_id;
  int shards = 1;          ///< array tasks: 0..shards-1
  int array_parallel = 0;  ///< at most this many tasks at once (%K), 0: Slurm's choice
  int gpus_per_task = 1;   ///< --gres=gpu:N per task; 0 writes no GPU request
  std::vector<std::string>
      sbatch_options;  ///< extra "#SBATCH <option>" lines, e.g. --partition=gpu
  bool keep_experiments = false;
};

/// The scripts' texts.
struct SlurmScripts {
  std::string array;   ///< sweep-array.sbatch
  std::string merge;   ///< sweep-merge.sbatch
  std::string submit;  ///< submit.sh: sbatch the array, then the merge with afterok on it
};

/// InvalidArgument for a shard count outside 1..100000, a negative K or GPU count, paths that
/// are not absolute, or an sbatch option with a line break. Never throws.
base::Result<SlurmScripts> slurm_scripts(const SlurmOptions& o);

/// Writes the scripts (each atomically, executable) and makes script_dir/logs. Never throws.
base::Result<void> write_slurm_scripts(const SlurmOptions& o);

/// The shard file of shard `index` of `count` in a sweep folder: DIR/shards/shard-I-of-N.h5.
std::filesystem::path shard_file(const std::filesystem::path& sweep_dir, int index, int count);

}  // namespace batchlens::analysis
