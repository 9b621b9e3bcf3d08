// SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

#include "app/cli/cli_progress.h"
#include "app/cli/command.h"
#include "app/cli/model_options.h"
#include "app/cli/preflight.h"
#include "core/base/atomic_file.h"
#include "core/experiment/culprit.h"
#include "core/experiment/experiment.h"
#include "core/experiment/runner.h"
#include "core/experiment/sweep.h"
#include "core/experiment/sweep_slurm.h"
#include "core/io/experiment_file.h"
#include "core/io/sweep_file.h"

namespace batchlens::cli {

namespace {

namespace fs = std::filesystem;

// The checks before a run: texts the file stores, --out, free space. False (with the exit code
// set and the reason printed) when the run must not start.
bool preflight(const experiment::ExperimentSpec& spec, const fs::path& out, int& exit_code) {
  if (auto ok = check_spec_text(spec); !ok.ok()) {
    std::cerr << "batchlens-cli run: " << ok.error().message << "\n";
    exit_code = kExitUsage;
    return false;
  }
  if (auto ok = check_output_path(out); !ok.ok()) {
    std::cerr << "batchlens-cli run: " << ok.error().message << "\n";
    exit_code = kExitUsage;
    return false;
  }
  const auto estimate = estimate_file_size(spec);
  const auto free = free_bytes_for(out);
  if (!estimate || !free) {
    return true;
  }
  const std::string folder = out.has_parent_path() ? out.parent_path().string() : ".";
  if (*free < estimate->low) {
    std::cerr << "batchlens-cli run: not enough space for " << out.string() << ": "
              << format_bytes(*free) << " free in " << folder << ", the experiment file needs "
              << "at least " << format_bytes(estimate->low) << " (" << base::errno_text(ENOSPC)
              << "; IoFailed)\n";
    exit_code = kExitFailure;
    return false;
  }
  if (*free < estimate->high) {
    std::cerr << "batchlens-cli run: warning: " << format_bytes(*free) << " free in " << folder
              << "; the experiment file may need up to " << format_bytes(estimate->high)
              << " (uncompressed bound). If it does not fit, the result is saved to "
              << rescue_paths().front().parent_path().string() << " instead.\n";
  }
  return true;
}

// Writes `result` to `out`; when that fails, to the first rescue path that works, so a computed
// result is never thrown away. Returns the path written, empty when every write failed.
fs::path write_or_rescue(const fs::path& out, const experiment::ExperimentResult& result,
                         const io::WriteOptions& options) {
  const auto written = io::write_experiment(out, result, options);
  if (written.ok()) {
    return out;
  }
  report_error(written.error());
  for (const fs::path& rescue : rescue_paths()) {
    const auto saved = io::write_experiment(rescue, result, options);
    if (saved.ok()) {
      std::cerr << "batchlens-cli: the computed experiment was saved to " << rescue.string()
                << " instead; move it where you want it\n";
      return rescue;
    }
    std::cerr << "batchlens-cli: could not save it to " << rescue.string()
              << " either: " << saved.error().message << "\n";
  }
  std::cerr << "batchlens-cli: the computed experiment could not be saved anywhere\n";
  return {};
}

}  // namespace

namespace {

// The spec options `run` and `culprit` share, as typed, then resolved into `spec`.
struct SpecOptions {
  ModelOptions model;
  experiment::ExperimentSpec spec;
  std::string prompt_ids;
  std::string batch_sizes = "2,3,4";
  std::string taps;
  std::string out;
  std::string rng = "per_row";
  std::string policy = "default";
  std::string workaround;
  // The program's edge: how files are written, as the environment sets it.
  io::WriteOptions write = io::WriteOptions::from_environment();
  std::string prefill = "copied";
  std::string mode = "free";
  bool raw = false;
  bool no_kernels = false;
};

void add_spec_options(CLI::App* cmd, SpecOptions& o, bool workaround,
                      const char* out_help = "Experiment file to write (.h5)") {
  add_model_options(cmd, o.model);
  auto& sp = o.spec;
  auto& ov = sp.overrides;
  auto* text =
      cmd->add_option("--prompt", sp.prompt, "Prompt text (Gemma chat template unless --raw)")
          ->capture_default_str();
  auto* ids = cmd->add_option("--prompt-ids", o.prompt_ids, "Prompt token ids, comma-separated");
  ids->excludes(text);
  cmd->add_flag("--raw", o.raw, "Do not apply the chat template to --prompt");
  cmd->add_option("--batch-sizes", o.batch_sizes, "Batched runs to compare with B=1")
      ->capture_default_str();
  cmd->add_option("--repeats", sp.repeats, "Extra B=1 runs (the noise floor)")
      ->capture_default_str();
  cmd->add_option("--gen-seed", sp.seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--steps", ov.max_denoising_steps, "max_denoising_steps [48]");
  cmd->add_option("--max-new-tokens", ov.max_new_tokens, "max_new_tokens [256]");
  cmd->add_option("--rng", o.rng, "per_row (BatchLens) or shared (the reference)")
      ->capture_default_str();
  cmd->add_option("--prefill", o.prefill, "copied (batch-1 cache in every row) or batched")
      ->capture_default_str();
  cmd->add_option("--mode", o.mode,
                  "free (each run its own trajectory) or lockstep (batched runs forced onto the "
                  "reference's canvas every step)")
      ->capture_default_str();
  cmd->add_option("--policy", o.policy,
                  "Kernel policy of every run: default, emulated_split_k (CPU emulation), "
                  "row_wise_all, batch_invariant, ... or a JSON file; join with +")
      ->capture_default_str();
  if (workaround) {
    cmd->add_option("--workaround", o.workaround,
                    "Also run everything with this policy added, e.g. issue_workaround");
  }
  cmd->add_option("--taps", o.taps,
                  "Comma-separated tap names to compare, or none (tokens and sampler only) [all]");
  cmd->add_flag("--no-kernels", o.no_kernels,
                "Do not record which kernels each op family launched per engine (one extra "
                "decoder pass per engine, with and without self-conditioning)");
  cmd->add_option("--out", o.out, out_help)->required();
}

// Fills o.spec from the typed options and runs the checks before any work. False (with the
// exit code set and the reason printed) when the command must not start.
bool resolve_spec(SpecOptions& o, const char* command, int& exit_code, bool file_out = true) {
  auto& mo = o.model;
  auto& spec = o.spec;
  if (mo.source.preset.empty() && mo.checkpoint.empty()) {
    std::cerr << "batchlens-cli " << command << ": give --preset or --checkpoint\n";
    exit_code = kExitUsage;
    return false;
  }
  if (!parse_mode(o.rng, generation::parse_rng_mode, spec.rng, command, exit_code) ||
      !parse_mode(o.prefill, generation::parse_prefill_mode, spec.prefill, command, exit_code) ||
      !parse_mode(o.mode, experiment::parse_run_mode, spec.mode, command, exit_code) ||
      !resolve_policy(o.policy, spec.policy, exit_code)) {
    return false;
  }
  if (!o.workaround.empty()) {
    spec.workaround.emplace();
    if (!resolve_policy(o.workaround, *spec.workaround, exit_code)) {
      return false;
    }
  }
  std::string bad;
  spec.batch_sizes.clear();
  if (!parse_int_list(o.prompt_ids, spec.prompt_ids, bad) ||
      !parse_int_list(o.batch_sizes, spec.batch_sizes, bad)) {
    std::cerr << "batchlens-cli " << command << ": bad number '" << bad << "'\n";
    exit_code = kExitUsage;
    return false;
  }
  std::stringstream taps(o.taps);
  for (std::string t; std::getline(taps, t, ',');) {
    spec.taps.push_back(t);
  }
  mo.source.checkpoint_dir = mo.checkpoint;
  spec.model = mo.source;
  spec.load = mo.load;
  spec.chat_template = !o.raw;
  spec.kernels = !o.no_kernels;
  if (!file_out) {
    if (auto text = check_spec_text(spec); !text.ok()) {
      exit_code = report_error(text.error());
      return false;
    }
    return true;
  }
  // Everything the write needs is checked before the run, which may take hours.
  return preflight(spec, o.out, exit_code);
}

// Runs `compute` under Ctrl-C cancellation with progress, prints the summary and writes the
// file (or rescues it); sets the exit code.
void compute_and_write(
    const SpecOptions& o,
    const std::function<base::Result<experiment::ExperimentResult>(const experiment::RunControl&)>&
        compute,
    int& exit_code) {
  base::Result<experiment::ExperimentResult> result = base::Error{};
  {
    const SigintCancel sigint;
    experiment::RunControl control;
    control.cancel = sigint.token();
    control.progress = draw_progress;
    result = compute(control);
  }
  std::fprintf(stderr, "\n");
  if (!result.ok()) {
    exit_code = report_error(result.error());
    return;
  }
  const fs::path out = o.out;
  const auto write_start = std::chrono::steady_clock::now();
  const auto written = write_or_rescue(out, result.value(), o.write);
  const double write_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - write_start).count();
  const auto& t = result.value().timings;
  std::cout << experiment::summary_text(result.value()) << "\n";
  if (written.empty()) {
    exit_code = kExitFailure;
    return;
  }
  std::cout << "wrote " << written.string() << "\n"
            << std::fixed << std::setprecision(2) << "time: load " << t.load_s << " s, engines "
            << t.engines_s << " s, per-tick copies and comparisons " << t.comparisons_s
            << " s (read back per canvas " << t.readback_s << " s), results " << t.results_s
            << " s, kernel provenance " << t.kernels_s << " s, file " << write_s << " s\n";
  // A rescued result is kept, but the command did not do what it was asked.
  exit_code = written == out ? kExitOk : kExitFailure;
}

}  // namespace

void register_run(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<SpecOptions>();
  auto* cmd = app.add_subcommand(
      "run",
      "Run a paired batch-size experiment (B=1 reference, B=1 repeats, batched runs; optionally "
      "again with a workaround policy) and write it to an HDF5 experiment file");
  add_spec_options(cmd, *opts, /*workaround=*/true);
  cmd->callback([opts, &exit_code] {
    if (!resolve_spec(*opts, "run", exit_code)) {
      return;
    }
    compute_and_write(
        *opts,
        [&](const experiment::RunControl& control) {
          return experiment::run_experiment(opts->spec, control);
        },
        exit_code);
  });
}

void register_culprit(CLI::App& app, int& exit_code) {
  struct Options {
    SpecOptions spec;
    std::string strategy = "row_wise";
    int cost_repeats = 5;
    bool free_trials = false;
    bool no_narrow = false;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "culprit",
      "Find the op families that, at least, must change for row 0 of every batch size to be "
      "bitwise B=1's: greedy from the first divergence, 1-minimal, layer ranges narrowed, "
      "confirmed in free mode; then measure the fix's cost. Writes one experiment file: the "
      "spec with the fix as its workaround, and the finder's trials");
  add_spec_options(cmd, opts->spec, /*workaround=*/false);
  cmd->add_option("--strategy", opts->strategy,
                  "How the culprit families are fixed: row_wise or batch_invariant")
      ->capture_default_str();
  cmd->add_option("--cost-repeats", opts->cost_repeats,
                  "Decoder passes timed per batch size, without and with the fix (0: no costs)")
      ->capture_default_str();
  cmd->add_flag("--free-trials", opts->free_trials,
                "Search and minimise in free mode too (slower; lockstep by default)");
  cmd->add_flag("--no-narrow", opts->no_narrow, "Keep each family's fix on every layer");
  cmd->callback([opts, &exit_code] {
    experiment::CulpritOptions co;
    if (opts->strategy == "row_wise") {
      co.strategy = ops::Strategy::RowWise;
    } else if (opts->strategy == "batch_invariant") {
      co.strategy = ops::Strategy::BatchInvariant;
    } else {
      std::cerr << "batchlens-cli culprit: --strategy must be row_wise or batch_invariant\n";
      exit_code = kExitUsage;
      return;
    }
    co.cost_repeats = std::max(0, opts->cost_repeats);
    co.lockstep_trials = !opts->free_trials;
    co.narrow_layers = !opts->no_narrow;
    if (!resolve_spec(opts->spec, "culprit", exit_code)) {
      return;
    }
    compute_and_write(
        opts->spec,
        [&](const experiment::RunControl& control) {
          return experiment::run_culprit_experiment(opts->spec.spec, co, control);
        },
        exit_code);
  });
}

struct SweepOptions {
  SpecOptions spec;
  std::string prompts;
  std::string seeds;
  std::string shard;
  bool keep = false;
  bool resume = false;
  // --slurm: write a job array instead of running.
  std::string slurm;
  int shards = 0;
  int array_parallel = 0;
  int gpus_per_task = 1;
  std::vector<std::string> sbatch_options;
};

// The sweep `o` describes: from the spec options, or with --resume the one in --out's
// sweep.json. Empty (exit code set, reason printed) when it must not start.
std::optional<experiment::SweepSpec> sweep_of(SweepOptions& o, int& exit_code) {
  if (o.resume) {
    auto spec = experiment::read_sweep_spec(o.spec.out);  // no record read here
    if (!spec.ok()) {
      exit_code = report_error(spec.error());
      return std::nullopt;
    }
    return std::move(spec).value();
  }
  if (!resolve_spec(o.spec, "sweep", exit_code, /*file_out=*/false)) {
    return std::nullopt;
  }
  experiment::SweepSpec sweep;
  sweep.base = o.spec.spec;
  const auto& b = sweep.base;
  if (!o.prompts.empty()) {
    auto prompts = experiment::read_prompts(o.prompts);
    if (!prompts.ok()) {
      exit_code = report_error(prompts.error());
      return std::nullopt;
    }
    sweep.prompts = std::move(prompts).value();
  } else {
    sweep.prompts = {{b.prompt, b.chat_template, b.prompt_ids}};
  }
  sweep.seeds = {b.seed};
  if (!o.seeds.empty()) {
    auto seeds = experiment::parse_seeds(o.seeds);
    if (!seeds.ok()) {
      std::cerr << "batchlens-cli sweep: " << seeds.error().message << "\n";
      exit_code = kExitUsage;
      return std::nullopt;
    }
    sweep.seeds = std::move(seeds).value();
  }
  if (auto v = experiment::validate(sweep); !v.ok()) {
    exit_code = report_error(v.error());
    return std::nullopt;
  }
  return sweep;
}

// --slurm: the sweep folder prepared and the job array's scripts written; nothing runs here.
int write_slurm(const SweepOptions& o, experiment::SweepSpec sweep) {
  std::error_code ec;
  // The tasks run from wherever submit.sh was started: a checkpoint folder is made absolute.
  auto& checkpoint = sweep.base.model.checkpoint_dir;
  if (!checkpoint.empty()) {
    checkpoint = fs::absolute(checkpoint, ec).string();
  }
  experiment::SlurmOptions so;
  so.cli = fs::read_symlink("/proc/self/exe", ec);
  so.sweep_dir = fs::absolute(o.spec.out, ec);
  so.script_dir = fs::absolute(o.slurm, ec);
  const int items = static_cast<int>(experiment::sweep_items(sweep).size());
  so.shards = o.shards > 0 ? o.shards : std::min(items, 100);
  so.array_parallel = o.array_parallel;
  so.gpus_per_task = o.gpus_per_task;
  so.sbatch_options = o.sbatch_options;
  so.keep_experiments = o.keep;
  auto id = experiment::prepare_sweep_dir(so.sweep_dir, sweep);
  if (!id.ok()) {
    return report_error(id.error());
  }
  so.sweep_id = id.value();
  if (auto w = experiment::write_slurm_scripts(so); !w.ok()) {
    return report_error(w.error());
  }
  std::cout << "sweep " << so.sweep_id << ": " << items << " item(s) in " << so.shards
            << " shard(s); folder " << so.sweep_dir.string() << "\n"
            << "scripts in " << so.script_dir.string()
            << ": sweep-array.sbatch (the job array), sweep-merge.sbatch (afterok), submit.sh\n"
            << "submit with: " << (so.script_dir / "submit.sh").string() << "\n"
            << "the merged sweep file will be " << (so.sweep_dir / "sweep.h5").string() << "\n";
  return kExitOk;
}

// Runs the sweep (or its --shard) here, then writes its sweep file: DIR/sweep.h5, or the shard's
// file DIR/shards/shard-I-of-N.h5.
int run_sweep_here(const SweepOptions& o, const experiment::SweepSpec& sweep) {
  experiment::SweepRunOptions run;
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
    run.keep = [dir = run.dir](const experiment::SweepItem& item,
                               const experiment::ExperimentResult& r) {
      std::error_code ec;
      fs::create_directories(dir / "experiments", ec);
      return io::write_experiment(experiment::kept_experiment(dir, item.index), r);
    };
  }
  base::Result<experiment::SweepOutcome> outcome = base::Error{};
  {
    const SigintCancel sigint;
    experiment::RunControl control;
    control.cancel = sigint.token();
    control.progress = draw_progress;
    control.load_progress = draw_progress;
    outcome = base::guarded([&] {
      const auto items = experiment::sweep_items(sweep);
      const setup::Session session = base::take(
          experiment::open_session_for(experiment::item_spec(sweep, items.front()), control));
      return base::take(experiment::run_sweep(session, sweep, run, control));
    });
  }
  std::fprintf(stderr, "\n");
  if (!outcome.ok()) {
    return report_error(outcome.error());
  }
  std::cout << "sweep " << outcome.value().id << ": " << outcome.value().items_run
            << " item(s) run, " << outcome.value().items_skipped
            << " finished before and skipped\n";
  const auto all = experiment::read_sweep_dir(run.dir);
  if (!all.ok()) {
    return report_error(all.error());
  }
  const experiment::SweepRecords part =
      experiment::shard_records(all.value(), run.shard, outcome.value().provenance);
  // A task of a job array (--shard, even 0/1) writes its own shard file for the merge job.
  const fs::path file = o.shard.empty()
                            ? run.dir / "sweep.h5"
                            : experiment::shard_file(run.dir, run.shard.index, run.shard.count);
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  if (auto w = io::write_sweep_file(file, part); !w.ok()) {
    return report_error(w.error());
  }
  std::cout << experiment::sweep_text(part) << "\nsweep file: " << file.string() << "\n";
  return kExitOk;
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
  add_spec_options(cmd, opts->spec, /*workaround=*/true,
                   "Sweep folder (sweep.json, one record per item, the sweep file; made when "
                   "missing)");
  cmd->add_option("--prompts", opts->prompts,
                  "Prompt file: one prompt per line, or JSON Lines with \"prompt\" or "
                  "\"prompt_ids\" and optional \"chat_template\" (default: --prompt alone)");
  cmd->add_option("--seeds", opts->seeds, "Sampling seeds, e.g. 0-23 or 0,5,9-11 [--gen-seed]");
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
  cmd->footer(kExitCodesHelp);
  cmd->callback([opts, cmd, &exit_code] {
    if (opts->resume) {
      // The spec comes from the folder: an option that would change it is refused, not ignored.
      for (const CLI::Option* option : cmd->get_options()) {
        const std::string name = option->get_name();
        const bool allowed = name == "--out" || name == "--resume" || name == "--shard" ||
                             name == "--keep-experiments" || name == "--help";
        if (option->count() > 0 && !allowed) {
          std::cerr << "batchlens-cli sweep: --resume takes the spec from the folder's "
                       "sweep.json; "
                    << name << " cannot change it (give --out, --shard, --keep-experiments)\n";
          exit_code = kExitUsage;
          return;
        }
      }
    }
    const auto sweep = sweep_of(*opts, exit_code);
    if (!sweep) {
      return;
    }
    exit_code = opts->slurm.empty() ? run_sweep_here(*opts, *sweep) : write_slurm(*opts, *sweep);
  });
}

void register_summary(CLI::App& app, int& exit_code) {
  struct Options {
    std::string file;
    bool json = false;
    bool kernels = false;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "summary",
      "Summarise an experiment file, a sweep file or a sweep folder (batchlens-cli sweep)");
  cmd->add_option("file", opts->file, "Experiment file (.h5), sweep file (.h5) or sweep folder")
      ->required();
  cmd->add_flag("--json", opts->json, "Print JSON");
  cmd->add_flag("--kernels", opts->kernels,
                "Also list, per engine, every op whose kernels differ from the B=1 "
                "reference's (the file's kernel provenance)");
  cmd->callback([opts, &exit_code] {
    // A sweep's folder or file.
    std::error_code ec;
    if (fs::is_directory(opts->file, ec) || io::is_sweep_file(opts->file)) {
      const auto s = io::read_sweep(opts->file);
      if (!s.ok()) {
        exit_code = report_error(s.error());
        return;
      }
      std::cout << (opts->json ? experiment::sweep_json(s.value()).dump(2) + "\n"
                               : experiment::sweep_text(s.value()));
      exit_code = kExitOk;
      return;
    }
    const auto r = io::read_experiment(opts->file);
    if (!r.ok()) {
      exit_code = report_error(r.error());
      return;
    }
    std::cout << (opts->json ? experiment::summary_json(r.value()).dump(2) + "\n"
                             : experiment::summary_text(r.value()));
    if (opts->kernels && !opts->json) {
      std::cout << "\n" << experiment::kernels_text(r.value());
    }
    exit_code = kExitOk;
  });
}

}  // namespace batchlens::cli
