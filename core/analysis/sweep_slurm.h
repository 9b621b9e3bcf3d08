// SPDX-License-Identifier: Apache-2.0
// A sweep fanned out on a Slurm cluster (issue #19): a job array with one task per shard, each
// running `batchlens-cli sweep --resume --out DIR --shard I/N` into its own shard file, and a
// merge job that depends on it (afterok) and runs `batchlens-cli sweep-merge`. BatchLens writes
// the scripts; Slurm schedules them. On a login node (issue #36: `remote TARGET sweep --slurm`)
// BatchLens also submits them and follows the jobs with squeue until the merged file is there:
// the items finished, the tasks' states, Cancel with scancel. Torch-free.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/experiment/runner.h"

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

/// A sweep's job array and merge job once submitted, as kept in script_dir/jobs.json.
struct SlurmJobs {
  std::string sweep_id;
  std::string array_job;  ///< the job array's id
  std::string merge_job;  ///< the merge job's id (afterok on the array)
  int shards = 0;
};

/// Submits the scripts write_slurm_scripts wrote (`sbatch --parsable` the array, then the merge
/// job with --dependency=afterok on it) and records both ids in script_dir/jobs.json
/// (atomically). Errors: IoFailed with sbatch's own words (no sbatch on PATH: said so; a merge
/// job refused: the array is cancelled again). Never throws.
base::Result<SlurmJobs> submit_slurm(const SlurmOptions& o);

/// The jobs script_dir/jobs.json records for `sweep_id`; empty when there is none or it is
/// another sweep's. FileCorrupted for a damaged file. Never throws.
base::Result<std::optional<SlurmJobs>> recorded_slurm_jobs(const std::filesystem::path& script_dir,
                                                           const std::string& sweep_id);

/// What Slurm says of a submitted sweep.
struct SlurmStatus {
  bool array_known = false;  ///< false: Slurm no longer knows the array (purged after MinJobAge)
  int pending = 0;           ///< array tasks not started (PENDING, CONFIGURING, REQUEUED, ...)
  int running = 0;           ///< RUNNING or COMPLETING
  int completed = 0;
  std::vector<int> failed_tasks;           ///< ended otherwise (FAILED, CANCELLED, TIMEOUT, ...)
  std::vector<std::string> failed_states;  ///< their states, in step with failed_tasks
  std::string merge_state;   ///< "PENDING", "RUNNING", "COMPLETED", ...; "" when unknown
  std::string merge_reason;  ///< e.g. "Dependency", "DependencyNeverSatisfied"

  /// Tasks are still to run or running.
  bool array_busy() const { return pending + running > 0; }
};

/// Reads `squeue -h -r -t all -o "%K %T %r"` output of the array (one line per task) and of the
/// merge job into a status; text that is not such output leaves the parts unknown.
SlurmStatus parse_squeue(const std::string& array_lines, const std::string& merge_lines);

/// Asks Slurm (squeue). Errors: IoFailed when squeue cannot be run or fails for another reason
/// than jobs it no longer knows. Never throws.
base::Result<SlurmStatus> slurm_status(const SlurmJobs& jobs);

/// scancel of both jobs (the tasks running end, the items they finished stay). Never throws.
base::Result<void> cancel_slurm(const SlurmJobs& jobs);

/// Following submitted jobs to their end.
struct SlurmWait {
  std::filesystem::path sweep_dir;   ///< items/ counted for progress; sweep.h5 awaited
  std::filesystem::path script_dir;  ///< logs/ read for a failure's reason
  int items = 0;                     ///< the sweep's items
  double poll_s = 20.0;              ///< seconds between squeue calls
  /// How long squeue may keep failing (a login node's controller restarting) before the wait
  /// gives up; the jobs go on.
  double squeue_patience_s = 300.0;
};

/// Follows `jobs` until the merge job wrote sweep_dir/sweep.h5 and returns its path. Progress:
/// the items finished in the folder over all of them, the tasks' states in the stage. Cancel
/// (control.cancel): scancel of both jobs, then Cancelled. Errors: IoFailed when array tasks
/// failed (once the others ended: which, in what state, their log's last line; the merge job
/// is cancelled), the merge job failed, or Slurm forgot the jobs without the merged file; the
/// finished items stay in the folder and a new submission runs only the rest. Never throws.
base::Result<std::filesystem::path> wait_slurm(const SlurmJobs& jobs, const SlurmWait& w,
                                               const experiment::RunControl& control = {});

}  // namespace batchlens::analysis
