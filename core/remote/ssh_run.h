// SPDX-License-Identifier: Apache-2.0
// Runs on a GPU server from the laptop, over the user's own OpenSSH (issue #36): their keys,
// agent, ~/.ssh/config and known_hosts; BatchMode, so no prompt ever waits and no host key is
// accepted by BatchLens. The spec travels as JSON on stdin (never inside a command line built
// from user text), progress comes back as JSON lines, Cancel ends the remote process group, and
// the file comes back over the same link with its SHA-256 checked before it is put in place.
// Torch-free header.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/analysis/sweep_spec.h"
#include "core/base/error.h"
#include "core/experiment/experiment.h"
#include "core/experiment/runner.h"

namespace batchlens::remote {

/// A GPU server as `ssh` reaches it.
struct SshTarget {
  std::string host;                        ///< an alias of ~/.ssh/config, host or user@host
  int port = 0;                            ///< 0: ssh's (or the config's) default
  std::string cli = "batchlens-cli";       ///< batchlens-cli there (PATH or a path)
  std::string workdir = "batchlens-runs";  ///< where its files are kept there (made)
  std::vector<std::string> ssh_options;    ///< more ssh arguments, e.g. "-F", "cfg"

  /// "user@gpu-server:2222".
  std::string describe() const;
};

/// "alias", "user@host" or "user@host:port". InvalidArgument for an empty target, one that
/// starts with '-' (an ssh option, e.g. -oProxyCommand=...) or holds spaces or control bytes.
/// Never throws.
base::Result<SshTarget> parse_target(const std::string& text);

/// The ssh command line (argv) that runs `remote_command` on `target` in BatchMode.
std::vector<std::string> ssh_argv(const SshTarget& target, const std::string& remote_command);

/// What the target says of itself (`batchlens-cli info --json` there).
struct TargetInfo {
  std::string version;  ///< BatchLens there
  std::string libtorch;
  /// Its host name (what an experiment recorded there names as its provenance host).
  std::string hostname;
  std::vector<std::string> devices;  ///< "cuda:0 (NVIDIA H200)", "cpu"
  int schema_major = 0;              ///< the experiment files it writes
  int schema_minor = 0;
};

/// Asks the target (`batchlens-cli info --json` over ssh). Errors: IoFailed with the reason
/// in plain words (host key, keys, unreachable, no batchlens-cli there); InvalidArgument when
/// it writes files of a newer schema than this build reads. Never throws.
base::Result<TargetInfo> probe(const SshTarget& target);

/// What a remote run did.
struct RemoteOutcome {
  std::string remote_path;  ///< the file on the target (kept there)
  std::string sha256;
  std::uint64_t bytes = 0;
  std::string summary;  ///< the target's stdout (the summary text)
};

/// Runs `command` ("run" or "culprit": both write one experiment file) of `spec` on the
/// target with `extra_args` (e.g. "--no-causes", "--strategy", "batch_invariant"):
/// progress into control.progress, Cancel (control.cancel) ends the remote process group; then
/// brings the file back to `local_out` (written beside it and renamed once its SHA-256 matches
/// the one the target computed). Errors: Cancelled; IoFailed (ssh, a dropped connection, a
/// file that does not match: the file stays on the target, fetch() brings it again); the
/// target's own errors (InvalidArgument, OutOfMemory, ...) with "on HOST: " in front. Never
/// throws.
base::Result<RemoteOutcome> run_remote(const SshTarget& target, const std::string& command,
                                       const experiment::ExperimentSpec& spec,
                                       const std::vector<std::string>& extra_args,
                                       const std::filesystem::path& local_out,
                                       const experiment::RunControl& control = {});

/// A batchlens-cli command run on the target that reads its input as JSON on stdin and writes
/// one file, reported by a "written" progress event (`run`, `culprit`: an experiment file;
/// `sweep`: its folder's sweep.h5).
struct RemoteJob {
  std::string command;       ///< "run", "culprit" or "sweep"
  std::string input_option;  ///< "--spec-json" or "--sweep-json": the option reading stdin
  std::string input_json;    ///< what goes to its stdin
  /// Its --out there, relative to the work folder (a sweep's folder, named by its id, so that
  /// the same sweep resumes there); "" names a fresh file after `local_out`.
  std::string out;
  std::vector<std::string> extra_args;
};

/// How a sweep is submitted on a Slurm login node (`batchlens-cli sweep --slurm --wait` there).
struct SlurmSubmit {
  int shards = 0;                           ///< array tasks; 0: one per item, at most 100
  int array_parallel = 0;                   ///< at most this many at once; 0: Slurm's choice
  int gpus_per_task = 1;                    ///< 0 for CPU nodes
  std::vector<std::string> sbatch_options;  ///< extra #SBATCH lines, e.g. "--partition=gpu"
  double poll_s = 20.0;                     ///< seconds between squeue calls there
};

/// The job that runs `sweep` on a target, in a folder there named by the sweep's id (the same
/// sweep resumes there). With `slurm`, the target is a login node: the sweep is submitted there
/// as a job array and a merge job and followed until the merged file (submitted once: the same
/// job again follows the jobs already there).
RemoteJob sweep_job(const analysis::SweepSpec& sweep,
                    const std::optional<SlurmSubmit>& slurm = std::nullopt);

/// Runs `job` on the target as run_remote does (progress, Cancel, the file back checked).
/// Errors as run_remote's; InvalidArgument for a command or input option other than those
/// above. Never throws.
base::Result<RemoteOutcome> run_remote_job(const SshTarget& target, const RemoteJob& job,
                                           const std::filesystem::path& local_out,
                                           const experiment::RunControl& control = {});

/// A minimal repro exported on the target (issue #36): `local_file` (an experiment file) goes
/// there over the connection (skipped when the work folder already holds a file of its SHA-256),
/// `batchlens-cli repro` runs on it with `repro_args` (e.g. "--op", "q_proj"; --out is BatchLens's)
/// where its GPU is, and the repro folder comes back as a tar stream into `local_dir` (built
/// beside it and renamed into place; a previous folder there is replaced). Cancel ends the remote
/// process group. Returns the remote folder and the target's stdout (what repro wrote).
/// Errors: IoFailed (ssh, the upload, the folder back), Cancelled, the repro's own failure with
/// "on HOST" in its message. Never throws.
base::Result<RemoteOutcome> run_remote_repro(const SshTarget& target,
                                             const std::filesystem::path& local_file,
                                             const std::vector<std::string>& repro_args,
                                             const std::filesystem::path& local_dir,
                                             const experiment::RunControl& control = {});

/// Brings `remote_path` from the target to `local_out` (atomically; with `sha256`, checked).
/// Errors: IoFailed. Never throws.
base::Result<void> fetch(const SshTarget& target, const std::string& remote_path,
                         const std::string& sha256, const std::filesystem::path& local_out);

}  // namespace batchlens::remote
