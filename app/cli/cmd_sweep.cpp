// SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

#include "app/cli/cli_progress.h"
#include "app/cli/command.h"
#include "app/cli/model_options.h"
#include "app/cli/spec_options.h"
#include "app/cli/sweep_options.h"
#include "core/analysis/sweep_merge.h"
#include "core/analysis/sweep_records.h"
#include "core/analysis/sweep_report.h"
#include "core/analysis/sweep_slurm.h"
#include "core/analysis/sweep_spec.h"
#include "core/base/input.h"
#include "core/base/sha256.h"
#include "core/experiment/experiment.h"
#include "core/experiment/runner.h"
#include "core/io/experiment_file.h"
#include "core/io/sweep_file.h"
#include "core/io/sweep_run.h"
#include "core/setup/prompt.h"

#include <unistd.h>

namespace batchlens::cli {

namespace {

namespace fs = std::filesystem;

}  // namespace

std::optional<analysis::SweepSpec> sweep_of(SweepOptions& o, int& exit_code) {
  if (!o.sweep_json.empty()) {
    std::string text;
    if (o.sweep_json == "-") {
      std::ostringstream in;
      in << std::cin.rdbuf();
      text = in.str();
    } else {
      auto read = base::read_input_file(o.sweep_json, "sweep JSON");
      if (!read.ok()) {
        exit_code = report_error(read.error());
        return std::nullopt;
      }
      text = std::move(read).value();
    }
    auto doc = base::parse_json(text, "sweep JSON");
    auto sweep = doc.ok() ? analysis::sweep_spec_from_json(doc.value())
                          : base::Result<analysis::SweepSpec>(doc.error());
    if (sweep.ok()) {
      if (auto v = analysis::validate(sweep.value()); !v.ok()) {
        sweep = v.error();
      }
    }
    if (!sweep.ok()) {
      std::cerr << "batchlens-cli sweep: --sweep-json: " << sweep.error().message << "\n";
      exit_code = kExitUsage;
      return std::nullopt;
    }
    return std::move(sweep).value();
  }
  if (o.resume) {
    auto spec = analysis::read_sweep_spec(o.spec.out);  // no record read here
    if (!spec.ok()) {
      exit_code = report_error(spec.error());
      return std::nullopt;
    }
    return std::move(spec).value();
  }
  o.spec.companion_axis = !o.companion_sets.empty();
  if (!resolve_spec(o.spec, "sweep", exit_code, /*file_out=*/false)) {
    return std::nullopt;
  }
  analysis::SweepInput in;
  in.base = o.spec.spec;
  in.prompts_file = o.prompts;
  in.seeds = o.seeds;
  in.companion_sets = o.companion_sets;
  in.rows = o.rows;
  auto sweep = analysis::sweep_from_input(in);
  if (!sweep.ok()) {
    const std::string& m = sweep.error().message;
    if (sweep.error().code == base::ErrorCode::InvalidArgument) {
      // "seeds: ..." and "rows: ..." name their option.
      const bool option = m.rfind("seeds:", 0) == 0 || m.rfind("rows:", 0) == 0;
      std::cerr << "batchlens-cli sweep: " << (option ? "--" : "") << m << "\n";
      exit_code = kExitUsage;
    } else {
      exit_code = report_error(sweep.error());
    }
    return std::nullopt;
  }
  return std::move(sweep).value();
}

namespace {

// Reports `e` (and, for --progress json, as an "error" event); the exit code.
int fail(const std::string& progress, const base::Error& e) {
  progress_event(progress, "error", {{"code", base::to_string(e.code)}, {"message", e.message}});
  return report_error(e);
}

// The "written" event of --progress json: where the file is, its size and SHA-256.
void written_event(const std::string& progress, const fs::path& file) {
  if (progress != "json") {
    return;
  }
  std::error_code ec;
  auto digest = base::sha256_file(file);
  progress_event(progress, "written",
                 {{"path", fs::absolute(file, ec).string()},
                  {"bytes", static_cast<std::uint64_t>(fs::file_size(file, ec))},
                  {"sha256", digest.ok() ? digest.value() : std::string()}});
}

// --submit / --wait: the scripts submitted (unless this sweep's jobs are still queued or ran to
// the merged file: then they are followed, nothing is submitted twice), then with --wait
// followed until the merged file is there.
int submit_and_follow(const SweepOptions& o, const analysis::SlurmOptions& so, int items) {
  const std::string& progress = o.spec.progress;
  progress_event(progress, "start", {{"pid", static_cast<std::int64_t>(::getpid())}});
  const fs::path merged = so.sweep_dir / "sweep.h5";
  auto recorded = analysis::recorded_slurm_jobs(so.script_dir, so.sweep_id);
  if (!recorded.ok()) {
    return fail(progress, recorded.error());
  }
  std::optional<analysis::SlurmJobs> jobs = recorded.value();
  if (jobs) {
    auto status = analysis::slurm_status(*jobs);
    if (!status.ok()) {
      return fail(progress, status.error());
    }
    const analysis::SlurmStatus& s = status.value();
    std::error_code ec;
    const bool alive = s.array_busy() || s.merge_state == "PENDING" || s.merge_state == "RUNNING" ||
                       s.merge_state == "COMPLETING";
    // Merged: the merge job completed, or Slurm has forgotten both jobs (purged after its
    // MinJobAge) and the merged file is there (written whole, by the merge job or a run of the
    // whole sweep).
    const bool merged_done =
        (s.merge_state == "COMPLETED" || (s.merge_state.empty() && !s.array_known)) &&
        fs::exists(merged, ec);
    const bool never = s.merge_reason.find("NeverSatisfied") != std::string::npos;
    if ((alive && !never) || merged_done) {
      std::cout << "following job array " << jobs->array_job << " and merge job " << jobs->merge_job
                << ", submitted before for this sweep\n";
    } else {
      if (never) {
        (void)analysis::cancel_slurm(*jobs);  // a merge job that can never run
      }
      jobs.reset();
    }
  }
  if (!jobs) {
    auto submitted = analysis::submit_slurm(so);
    if (!submitted.ok()) {
      return fail(progress, submitted.error());
    }
    jobs = submitted.value();
    std::cout << "submitted: job array " << jobs->array_job << " (" << so.shards
              << " tasks), merge job " << jobs->merge_job << " (afterok)\n";
  }
  if (!o.wait) {
    std::cout << "the merged sweep file will be " << merged.string()
              << "; follow it with the same command and --wait\n";
    return kExitOk;
  }
  base::Result<fs::path> done = base::Error{};
  {
    const SigintCancel sigint;
    experiment::RunControl control;
    control.cancel = sigint.token();
    control.progress = progress_reporter(progress);
    analysis::SlurmWait w;
    w.sweep_dir = so.sweep_dir;
    w.script_dir = so.script_dir;
    w.items = items;
    w.poll_s = o.poll_s;
    done = analysis::wait_slurm(*jobs, w, control);
  }
  if (progress != "json") {
    std::fprintf(stderr, "\n");
  }
  if (!done.ok()) {
    return fail(progress, done.error());
  }
  auto records = io::read_sweep_file(done.value());
  if (!records.ok()) {
    return fail(progress, records.error());
  }
  std::cout << analysis::sweep_text(records.value()) << "\nsweep file: " << done.value().string()
            << "\n";
  written_event(progress, done.value());
  return kExitOk;
}

// --slurm: the sweep folder prepared and the job array's scripts written; nothing runs here
// (with --submit, sbatch; with --wait, followed to the merged file).
int write_slurm(const SweepOptions& o, analysis::SweepSpec sweep) {
  std::error_code ec;
  // The tasks run from wherever submit.sh was started: a checkpoint folder is made absolute.
  auto& checkpoint = sweep.base.model.checkpoint_dir;
  if (!checkpoint.empty()) {
    checkpoint = fs::absolute(checkpoint, ec).string();
  }
  analysis::SlurmOptions so;
  so.cli = fs::read_symlink("/proc/self/exe", ec);
  so.sweep_dir = fs::absolute(o.spec.out, ec);
  so.script_dir = fs::absolute(o.slurm, ec);
  const int items = static_cast<int>(analysis::sweep_items(sweep).size());
  so.shards = o.shards > 0 ? o.shards : std::min(items, 100);
  so.array_parallel = o.array_parallel;
  so.gpus_per_task = o.gpus_per_task;
  so.sbatch_options = o.sbatch_options;
  so.keep_experiments = o.keep;
  auto id = analysis::prepare_sweep_dir(so.sweep_dir, sweep);
  if (!id.ok()) {
    return report_error(id.error());
  }
  so.sweep_id = id.value();
  if (auto w = analysis::write_slurm_scripts(so); !w.ok()) {
    return report_error(w.error());
  }
  std::cout << "sweep " << so.sweep_id << ": " << items << " item(s) in " << so.shards
            << " shard(s); folder " << so.sweep_dir.string() << "\n"
            << "scripts in " << so.script_dir.string()
            << ": sweep-array.sbatch (the job array), sweep-merge.sbatch (afterok), submit.sh\n";
  if (!o.submit && !o.wait) {
    std::cout << "submit with: " << (so.script_dir / "submit.sh").string() << "\n"
              << "the merged sweep file will be " << (so.sweep_dir / "sweep.h5").string() << "\n";
    return kExitOk;
  }
  return submit_and_follow(o, so, items);
}

// Runs the sweep (or its --shard) here, then writes its sweep file: DIR/sweep.h5, or the shard's
// file DIR/shards/shard-I-of-N.h5.
int run_sweep_here(const SweepOptions& o, const analysis::SweepSpec& sweep) {
  analysis::SweepRunOptions run;
  run.dir = o.spec.out;
  if (!o.shard.empty()) {
    char slash = 0;
    std::istringstream in(o.shard);
    if (!(in >> run.shard.index >> slash >> run.shard.count) || slash != '/' || !in.eof() ||
        run.shard.count < 1 || run.shard.index < 0 || run.shard.index >= run.shard.count) {
      std::cerr << "batchlens-cli sweep: --shard must be I/N with 0 <= I < N\n";
      return kExitUsage;
    }
  }
  if (o.keep) {
    run.keep = [dir = run.dir](const analysis::SweepItem& item,
                               const experiment::ExperimentResult& r) {
      std::error_code ec;
      fs::create_directories(dir / "experiments", ec);
      return io::write_experiment(analysis::kept_experiment(dir, item.index), r);
    };
  }
  base::Result<io::SweepFileRun> done = base::Error{};
  const std::string& progress = o.spec.progress;  // "bar", or "json" (remote TARGET sweep)
  progress_event(progress, "start", {{"pid", static_cast<std::int64_t>(::getpid())}});
  {
    const SigintCancel sigint;
    experiment::RunControl control;
    control.cancel = sigint.token();
    control.progress = progress_reporter(progress);
    control.load_progress = progress_reporter(progress);
    // A task of a job array (--shard, even 0/1) writes its own shard file for the merge job.
    done = io::run_sweep_to_file(sweep, run, /*shard_file=*/!o.shard.empty(), control);
  }
  if (progress != "json") {
    std::fprintf(stderr, "\n");
  }
  if (!done.ok()) {
    return fail(progress, done.error());
  }
  const io::SweepFileRun& r = done.value();
  std::cout << "sweep " << r.outcome.id << ": " << r.outcome.items_run << " item(s) run, "
            << r.outcome.items_skipped << " finished before and skipped\n"
            << analysis::sweep_text(r.records) << "\nsweep file: " << r.file.string() << "\n";
  const fs::path& file = r.file;
  written_event(progress, file);
  return kExitOk;
}

}  // namespace

void add_sweep_spec_options(CLI::App* cmd, SweepOptions& o, const char* out_help) {
  add_spec_options(cmd, o.spec, /*workaround=*/true, out_help);
  cmd->add_option("--prompts", o.prompts,
                  "Prompt file: one prompt per line, or JSON Lines with \"prompt\" or "
                  "\"prompt_ids\" and optional \"chat_template\" (default: --prompt alone)");
  cmd->add_option("--seeds", o.seeds, "Sampling seeds, e.g. 0-23 or 0,5,9-11 [--gen-seed]");
  cmd->add_option("--companion-sets", o.companion_sets,
                  "An axis of the sweep: companions files, comma-separated, 'none' for identical "
                  "rows (e.g. none,short.txt,long.jsonl); every item runs beside each set "
                  "[--companions]");
  cmd->add_option(
      "--rows", o.rows,
      "An axis of the sweep: the rows that hold the prompt under test, e.g. 0,3 [--row]");
  cmd->add_option("--sweep-json", o.sweep_json,
                  "The whole sweep as JSON (what `remote TARGET sweep` sends), from a file or "
                  "'-' for stdin: the spec options, --prompts, --seeds and the axes are then not "
                  "read");
}

void register_sweep(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<SweepOptions>();
  auto* cmd = app.add_subcommand(
      "sweep",
      "Run the experiment over many prompts x seeds on one loaded model: per item and batch size, "
      "whether row 0's text changed, how many tokens, the stop and steps, and where it first "
      "diverged (every tap is compared to find it; only these rows are kept, the per-step arrays "
      "only with --keep-experiments). Each finished item is committed to the sweep folder on its "
      "own: the same command (or --resume) after a crash or Ctrl-C skips what is done. The rows "
      "end in DIR/sweep.h5 (a shard: DIR/shards/shard-I-of-N.h5; sweep-merge joins them). "
      "--slurm writes a Slurm job array instead of running. `summary` prints the statistics");
  add_sweep_spec_options(cmd, *opts,
                         "Sweep folder (sweep.json, one record per item, the sweep file; made "
                         "when missing)");
  cmd->add_option("--shard", opts->shard,
                  "I/N: run only the items whose index modulo N is I (one Slurm array task)");
  cmd->add_flag("--keep-experiments", opts->keep,
                "Also write each item's full experiment file (experiments/item-NNNNNN.h5)");
  cmd->add_flag("--resume", opts->resume,
                "Run the sweep described in --out's sweep.json (written by an earlier sweep or "
                "--slurm); no spec options");
  cmd->add_option("--slurm", opts->slurm,
                  "Write a Slurm job array (one task per shard, one GPU each) and a merge job "
                  "that depends on it into this folder, with submit.sh; run nothing here");
  cmd->add_option("--shards", opts->shards, "With --slurm: array tasks [items, at most 100]");
  cmd->add_option("--array-parallel", opts->array_parallel,
                  "With --slurm: at most K tasks at once (#SBATCH --array=0-(N-1)%K)");
  cmd->add_option("--gpus-per-task", opts->gpus_per_task,
                  "With --slurm: --gres=gpu:N per task; 0 for CPU nodes")
      ->capture_default_str();
  cmd->add_option("--sbatch-option", opts->sbatch_options,
                  "With --slurm: an extra #SBATCH line, e.g. --partition=gpu (repeatable)");
  cmd->add_flag("--submit", opts->submit,
                "With --slurm: submit the scripts here (a login node) and print the job ids; "
                "jobs of this sweep still queued are followed instead of submitted twice");
  cmd->add_flag("--wait", opts->wait,
                "With --slurm: submit (as --submit), then follow the jobs until the merged file "
                "is there: progress, the tasks' states, a failed task's log; Ctrl-C cancels the "
                "jobs (scancel), a closed terminal leaves them running");
  cmd->add_option("--poll-s", opts->poll_s, "With --wait: seconds between squeue calls")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  cmd->footer(kExitCodesHelp);
  cmd->callback([opts, cmd, &exit_code] {
    if (opts->resume) {
      // The spec comes from the folder: an option that would change it is refused, not ignored.
      for (const CLI::Option* option : cmd->get_options()) {
        const std::string name = option->get_name();
        const bool allowed = name == "--out" || name == "--resume" || name == "--shard" ||
                             name == "--keep-experiments" || name == "--progress" ||
                             name == "--help";
        if (option->count() > 0 && !allowed) {
          std::cerr << "batchlens-cli sweep: --resume takes the spec from the folder's "
                       "sweep.json; "
                    << name << " cannot change it (give --out, --shard, --keep-experiments)\n";
          exit_code = kExitUsage;
          return;
        }
      }
    }
    if (!opts->sweep_json.empty()) {
      // The whole sweep comes as JSON: an option that would change it is refused, not ignored.
      for (const CLI::Option* option : cmd->get_options()) {
        const std::string name = option->get_name();
        const bool allowed = name == "--out" || name == "--sweep-json" || name == "--shard" ||
                             name == "--keep-experiments" || name == "--progress" ||
                             name == "--slurm" || name == "--shards" ||
                             name == "--array-parallel" || name == "--gpus-per-task" ||
                             name == "--sbatch-option" || name == "--submit" || name == "--wait" ||
                             name == "--poll-s" || name == "--help";
        if (option->count() > 0 && !allowed) {
          std::cerr << "batchlens-cli sweep: --sweep-json holds the whole sweep; " << name
                    << " cannot change it\n";
          exit_code = kExitUsage;
          return;
        }
      }
    }
    const auto sweep = sweep_of(*opts, exit_code);
    if (!sweep) {
      return;
    }
    if (opts->slurm.empty() && (opts->submit || opts->wait)) {
      std::cerr << "batchlens-cli sweep: --submit and --wait go with --slurm DIR\n";
      exit_code = kExitUsage;
      return;
    }
    exit_code = opts->slurm.empty() ? run_sweep_here(*opts, *sweep) : write_slurm(*opts, *sweep);
  });
}

}  // namespace batchlens::cli
