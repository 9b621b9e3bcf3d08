// SPDX-License-Identifier: Apache-2.0
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "app/cli/cli_progress.h"
#include "app/cli/command.h"
#include "app/cli/model_options.h"
#include "app/cli/spec_options.h"
#include "app/cli/sweep_options.h"
#include "core/analysis/sweep_spec.h"
#include "core/io/experiment_file.h"
#include "core/remote/ssh_run.h"

#include <unistd.h>

namespace batchlens::cli {

namespace {

struct RemoteOptions {
  std::string target;
  std::string cli = "batchlens-cli";
  std::string workdir = "batchlens-runs";
  std::vector<std::string> ssh_options;
  SpecOptions run;
  SpecOptions culprit;
  SweepOptions sweep;
  bool slurm = false;  // remote sweep --slurm: a job array submitted there, followed from here
  // remote repro: the file here, repro's own options passed on as given.
  std::string repro_file;
  std::string repro_out;
  std::string comparison;
  std::string op;
  int layer = -1;
  int step = -1;
  int canvas = 1;
  std::string max_bytes;
  std::string strategy = "row_wise";
  int cost_repeats = 5;
  bool free_trials = false;
  bool no_narrow = false;
  std::string fetch_path;
  std::string fetch_out;
  std::string fetch_sha256;
};

// The target of the options, or false (reason printed, exit code set).
bool target_of(const RemoteOptions& o, remote::SshTarget& t, int& exit_code) {
  auto parsed = remote::parse_target(o.target);
  if (!parsed.ok()) {
    std::cerr << "batchlens-cli remote: " << parsed.error().message << "\n";
    exit_code = kExitUsage;
    return false;
  }
  t = std::move(parsed).value();
  t.cli = o.cli;
  t.workdir = o.workdir;
  for (const std::string& opt : o.ssh_options) {
    // Each --ssh-option is "-F FILE" or "-o Key=Value" style, split once at the first space.
    const std::size_t sp = opt.find(' ');
    t.ssh_options.push_back(opt.substr(0, sp));
    if (sp != std::string::npos) {
      t.ssh_options.push_back(opt.substr(sp + 1));
    }
  }
  return true;
}

// Runs `work(control)` under Ctrl-C cancellation with `progress` ("bar" or "json"), then says
// what came back to `local` (or the error); sets the exit code.
void remote_work(
    const remote::SshTarget& t, const std::string& progress, const std::string& local,
    const std::function<base::Result<remote::RemoteOutcome>(const experiment::RunControl&)>& work,
    int& exit_code) {
  base::Result<remote::RemoteOutcome> result = base::Error{};
  {
    const SigintCancel sigint;
    experiment::RunControl control;
    control.cancel = sigint.token();
    control.progress = progress_reporter(progress);
    result = work(control);
  }
  if (progress != "json") {
    std::fprintf(stderr, "\n");
  }
  if (!result.ok()) {
    exit_code = report_error(result.error());
    return;
  }
  const remote::RemoteOutcome& r = result.value();
  std::cout << r.summary << "wrote " << local << " (from " << t.describe() << ":" << r.remote_path;
  if (!r.sha256.empty()) {
    std::cout << ", " << r.bytes << " bytes, SHA-256 " << r.sha256 << " checked";
  }
  std::cout << ")\n";
  exit_code = kExitOk;
}

// `command` (run, culprit) of `spec` on the target with `extra` arguments there; the file
// comes back to spec.out. Sets exit_code.
void run_there(const RemoteOptions& o, const char* command, SpecOptions& spec,
               const std::vector<std::string>& extra, int& exit_code) {
  remote::SshTarget t;
  if (!target_of(o, t, exit_code)) {
    return;
  }
  // The spec is checked here as the command checks it, but not against this machine's devices
  // and memory: it runs there (its out file is checked here, where it lands).
  const std::string what = std::string("remote ") + command;
  if (!resolve_spec(spec, what.c_str(), exit_code, /*file_out=*/false)) {
    return;
  }
  // Where the file lands is checked before the run, which may take hours.
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::absolute(spec.out, ec).parent_path();
  std::filesystem::create_directories(parent, ec);
  if (ec || ::access(parent.c_str(), W_OK) != 0) {
    std::cerr << "batchlens-cli " << what << ": cannot write into " << parent.string() << "\n";
    exit_code = kExitUsage;
    return;
  }
  remote_work(
      t, spec.progress, spec.out,
      [&](const experiment::RunControl& control) {
        return remote::run_remote(t, command, spec.spec, extra, spec.out, control);
      },
      exit_code);
}

// `remote TARGET sweep`: the sweep's options, read here; the whole sweep runs there.
void add_remote_sweep(CLI::App* cmd, const std::shared_ptr<RemoteOptions>& o, int& exit_code) {
  auto* sweep = cmd->add_subcommand(
      "sweep",
      "`batchlens-cli sweep` on the target, in a folder there named by the sweep's id (the same "
      "command again resumes it there, skipping the items done); its sweep file comes back to "
      "--out here");
  add_sweep_spec_options(sweep, o->sweep, "Sweep file to write here (.h5)");
  sweep->add_flag("--slurm", o->slurm,
                  "The target is a Slurm login node: the sweep is submitted there as a job array "
                  "and a merge job (`sweep --slurm --wait` there) and followed until the merged "
                  "file comes back; Ctrl-C cancels the jobs, a dropped connection leaves them "
                  "running (the same command follows them again)");
  sweep->add_option("--shards", o->sweep.shards, "With --slurm: array tasks [items, at most 100]");
  sweep->add_option("--array-parallel", o->sweep.array_parallel,
                    "With --slurm: at most K tasks at once");
  sweep
      ->add_option("--gpus-per-task", o->sweep.gpus_per_task,
                   "With --slurm: --gres=gpu:N per task; 0 for CPU nodes")
      ->capture_default_str();
  sweep->add_option("--sbatch-option", o->sweep.sbatch_options,
                    "With --slurm: an extra #SBATCH line, e.g. --partition=gpu (repeatable)");
  sweep->add_option("--poll-s", o->sweep.poll_s, "With --slurm: seconds between squeue calls there")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  sweep->callback([o, &exit_code] {
    remote::SshTarget t;
    if (!target_of(*o, t, exit_code)) {
      return;
    }
    SweepOptions& so = o->sweep;
    const std::string local_out = so.spec.out;
    if (local_out.empty()) {
      std::cerr << "batchlens-cli remote sweep: give --out (the sweep file here)\n";
      exit_code = kExitUsage;
      return;
    }
    // Prompts and companions files are read here; the whole sweep travels as JSON.
    const auto spec = sweep_of(so, exit_code);
    if (!spec) {
      return;
    }
    std::error_code ec;
    const std::filesystem::path parent = std::filesystem::absolute(local_out, ec).parent_path();
    std::filesystem::create_directories(parent, ec);
    if (ec || ::access(parent.c_str(), W_OK) != 0) {
      std::cerr << "batchlens-cli remote sweep: cannot write into " << parent.string() << "\n";
      exit_code = kExitUsage;
      return;
    }
    std::optional<remote::SlurmSubmit> slurm;
    if (o->slurm) {
      slurm = remote::SlurmSubmit{so.shards, so.array_parallel, so.gpus_per_task, so.sbatch_options,
                                  so.poll_s};
    }
    const remote::RemoteJob job = remote::sweep_job(*spec, slurm);
    remote_work(
        t, so.spec.progress, local_out,
        [&](const experiment::RunControl& control) {
          return remote::run_remote_job(t, job, local_out, control);
        },
        exit_code);
  });
}

// `remote TARGET repro FILE --out DIR`: the file goes there, the repro is exported where its
// GPU is, the folder comes back.
void add_remote_repro(CLI::App* cmd, const std::shared_ptr<RemoteOptions>& o, int& exit_code) {
  auto* repro = cmd->add_subcommand(
      "repro",
      "`batchlens-cli repro` on the target (the model loaded there, on the GPU the experiment "
      "ran on): the experiment file goes there over the connection, the repro folder comes "
      "back to --out here");
  repro->add_option("file", o->repro_file, "Experiment file here (.h5)")->required();
  repro->add_option("--out", o->repro_out, "Folder to write here (a previous repro is replaced)")
      ->required();
  repro->add_option("--comparison", o->comparison, "As `repro --comparison`");
  repro->add_option("--op", o->op, "As `repro --op`");
  repro->add_option("--layer", o->layer, "As `repro --layer`");
  repro->add_option("--step", o->step, "As `repro --step`");
  repro->add_option("--canvas", o->canvas, "As `repro --canvas`")->capture_default_str();
  repro->add_option("--max-bytes", o->max_bytes, "As `repro --max-bytes`");
  repro->callback([o, &exit_code] {
    remote::SshTarget t;
    if (!target_of(*o, t, exit_code)) {
      return;
    }
    // The file is checked here first: a damaged one is refused before anything travels.
    if (auto header = io::read_experiment(o->repro_file); !header.ok()) {
      exit_code = report_error(header.error());
      return;
    }
    std::vector<std::string> args;
    const auto pass = [&args](const char* name, const std::string& value) {
      if (!value.empty()) {
        args.insert(args.end(), {name, value});
      }
    };
    pass("--comparison", o->comparison);
    pass("--op", o->op);
    pass("--layer", o->layer >= 0 ? std::to_string(o->layer) : std::string());
    pass("--step", o->step >= 0 ? std::to_string(o->step) : std::string());
    pass("--canvas", std::to_string(o->canvas));
    pass("--max-bytes", o->max_bytes);
    remote_work(
        t, "bar", o->repro_out,
        [&](const experiment::RunControl& control) {
          return remote::run_remote_repro(t, o->repro_file, args, o->repro_out, control);
        },
        exit_code);
  });
}

}  // namespace

void register_remote(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<RemoteOptions>();
  auto* cmd = app.add_subcommand(
      "remote",
      "Run on a GPU server over SSH (your keys, agent and ~/.ssh/config; no password prompt): "
      "the spec goes over stdin, progress comes back, Ctrl-C ends the run there, the file comes "
      "back checked");
  cmd->add_option("target", o->target, "An alias of ~/.ssh/config, host, user@host[:port]")
      ->required();
  cmd->add_option("--cli", o->cli, "batchlens-cli on the target (PATH or a path)")
      ->capture_default_str();
  cmd->add_option("--workdir", o->workdir,
                  "Folder on the target where its files are kept (made; relative to the login "
                  "folder)")
      ->capture_default_str();
  cmd->add_option("--ssh-option", o->ssh_options,
                  "More for ssh, e.g. \"-F /path/ssh_config\" or \"-o ConnectTimeout=10\" "
                  "(repeatable)");
  cmd->require_subcommand(1);

  auto* probe = cmd->add_subcommand("probe", "What the target has: BatchLens, LibTorch, devices");
  probe->callback([o, &exit_code] {
    remote::SshTarget t;
    if (!target_of(*o, t, exit_code)) {
      return;
    }
    auto info = remote::probe(t);
    if (!info.ok()) {
      exit_code = report_error(info.error());
      return;
    }
    std::cout << t.describe() << ": BatchLens " << info.value().version << ", LibTorch "
              << info.value().libtorch << ", files " << info.value().schema_major << "."
              << info.value().schema_minor << "\n";
    for (const std::string& d : info.value().devices) {
      std::cout << "  " << t.host << ": " << d << "\n";
    }
    exit_code = kExitOk;
  });

  auto* run = cmd->add_subcommand(
      "run", "`batchlens-cli run` on the target; the experiment file comes back to --out here");
  add_spec_options(run, o->run, /*workaround=*/true,
                   "Experiment file to write here (.h5); the target keeps its own copy");
  run->add_flag("--no-causes", o->run.no_causes, "As `run --no-causes`");
  run->add_flag("--no-exact", o->run.no_exact, "As `run --no-exact`");
  run->callback([o, &exit_code] {
    std::vector<std::string> extra;
    if (o->run.no_causes) {
      extra.emplace_back("--no-causes");
    }
    if (o->run.no_exact) {
      extra.emplace_back("--no-exact");
    }
    run_there(*o, "run", o->run, extra, exit_code);
  });

  auto* culprit = cmd->add_subcommand(
      "culprit",
      "`batchlens-cli culprit` on the target (the op families to fix, the fix's cost); its "
      "experiment file comes back to --out here");
  add_spec_options(culprit, o->culprit, /*workaround=*/false,
                   "Experiment file to write here (.h5); the target keeps its own copy");
  culprit
      ->add_option("--strategy", o->strategy,
                   "As `culprit --strategy`: row_wise or "
                   "batch_invariant")
      ->check(CLI::IsMember({"row_wise", "batch_invariant"}))
      ->capture_default_str();
  culprit->add_option("--cost-repeats", o->cost_repeats, "As `culprit --cost-repeats`")
      ->capture_default_str();
  culprit->add_flag("--free-trials", o->free_trials, "As `culprit --free-trials`");
  culprit->add_flag("--no-narrow", o->no_narrow, "As `culprit --no-narrow`");
  culprit->callback([o, &exit_code] {
    std::vector<std::string> extra{"--strategy", o->strategy, "--cost-repeats",
                                   std::to_string(o->cost_repeats)};
    if (o->free_trials) {
      extra.emplace_back("--free-trials");
    }
    if (o->no_narrow) {
      extra.emplace_back("--no-narrow");
    }
    run_there(*o, "culprit", o->culprit, extra, exit_code);
  });

  add_remote_sweep(cmd, o, exit_code);
  add_remote_repro(cmd, o, exit_code);

  auto* fetch = cmd->add_subcommand(
      "fetch", "Bring a file a remote run left on the target (e.g. after a dropped connection)");
  fetch->add_option("path", o->fetch_path, "The file on the target")->required();
  fetch->add_option("--out", o->fetch_out, "Where to write it here")->required();
  fetch->add_option("--sha256", o->fetch_sha256, "Its SHA-256, checked before it is kept");
  fetch->callback([o, &exit_code] {
    remote::SshTarget t;
    if (!target_of(*o, t, exit_code)) {
      return;
    }
    if (auto r = remote::fetch(t, o->fetch_path, o->fetch_sha256, o->fetch_out); !r.ok()) {
      exit_code = report_error(r.error());
      return;
    }
    std::cout << "wrote " << o->fetch_out << "\n";
    exit_code = kExitOk;
  });
}

}  // namespace batchlens::cli
