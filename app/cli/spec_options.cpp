// SPDX-License-Identifier: Apache-2.0
#include "app/cli/spec_options.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>

#include "app/cli/cli_progress.h"
#include "app/cli/command.h"
#include "app/cli/model_options.h"
#include "app/cli/preflight.h"
#include "core/analysis/culprit.h"
#include "core/analysis/summary.h"
#include "core/base/atomic_file.h"
#include "core/base/input.h"
#include "core/base/sha256.h"
#include "core/base/system_info.h"
#include "core/compat/profile.h"
#include "core/experiment/experiment.h"
#include "core/experiment/runner.h"
#include "core/io/experiment_file.h"
#include "core/model/config.h"
#include "core/setup/prompt.h"

#include <unistd.h>

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

void add_spec_options(CLI::App* cmd, SpecOptions& o, bool workaround, const char* out_help) {
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
  o.prefill_option =
      cmd->add_option("--prefill", o.prefill,
                      "copied (batch-1 cache in every row) or batched [copied; batched with "
                      "--companions]");
  cmd->add_option("--companions", o.companions,
                  "Prompts of the other rows of every batch (one per line, or JSON Lines with "
                  "\"prompt\"/\"prompt_ids\"), cycled: a batch of different prompts, left-padded "
                  "and masked as transformers' generate builds it. The B=1 reference is the prompt "
                  "alone");
  cmd->add_option("--row", o.row, "Which row of every batch holds the prompt under test")
      ->capture_default_str();
  cmd->add_option("--positions", o.positions,
                  "Position ids of a padded batch: shared (transformers' generate: one set from "
                  "the padded length) or per_row (each row from its own mask, what a fix would do)")
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
  cmd->add_option("--spec-json", o.spec_json,
                  "The whole experiment spec as JSON (an experiment file's spec, 'summary --json' "
                  "of none; '-' reads stdin): the spec options above are then not read");
  cmd->add_option("--progress", o.progress,
                  "bar (a terminal progress bar) or json (JSON lines on stderr, for programs)")
      ->capture_default_str();
}

namespace {

// --spec-json: the spec from a file or stdin ("-"), checked as a file's spec is. False (with the
// exit code set and the reason printed) when it is not one.
bool spec_from_json_option(SpecOptions& o, const char* command, int& exit_code) {
  base::Result<std::string> text = std::string();
  if (o.spec_json == "-") {
    std::string all;
    char buf[65536];
    std::size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, stdin)) > 0) {
      all.append(buf, n);
      if (all.size() > base::kMaxTextFileBytes) {
        text = base::Error{base::ErrorCode::InvalidArgument, "the spec on stdin is too large"};
        break;
      }
    }
    if (text.ok()) {
      text = std::move(all);
    }
  } else {
    text = base::read_input_file(o.spec_json, "spec JSON");
  }
  base::Result<experiment::ExperimentSpec> spec =
      text.ok() ? experiment::spec_from_json_text(text.value())
                : base::Result<experiment::ExperimentSpec>(text.error());
  if (spec.ok()) {
    if (auto v = experiment::validate(spec.value()); !v.ok()) {
      spec = v.error();
    }
  }
  if (!spec.ok()) {
    std::cerr << "batchlens-cli " << command << ": --spec-json: " << spec.error().message << "\n";
    exit_code = kExitUsage;
    return false;
  }
  o.spec = std::move(spec).value();
  return true;
}

}  // namespace

// Fills o.spec from the typed options and runs the checks before any work. False (with the
// exit code set and the reason printed) when the command must not start.
bool resolve_spec(SpecOptions& o, const char* command, int& exit_code, bool file_out) {
  auto& mo = o.model;
  auto& spec = o.spec;
  if (o.progress != "bar" && o.progress != "json") {
    std::cerr << "batchlens-cli " << command << ": --progress is bar or json, not '" << o.progress
              << "'\n";
    exit_code = kExitUsage;
    return false;
  }
  if (!o.spec_json.empty()) {
    return spec_from_json_option(o, command, exit_code) &&
           (!file_out || preflight(spec, o.out, exit_code));
  }
  if (mo.source.preset.empty() && mo.checkpoint.empty()) {
    std::cerr << "batchlens-cli " << command << ": give --preset or --checkpoint\n";
    exit_code = kExitUsage;
    return false;
  }
  if (!parse_mode(o.rng, generation::parse_rng_mode, spec.rng, command, exit_code) ||
      !parse_mode(o.prefill, generation::parse_prefill_mode, spec.prefill, command, exit_code) ||
      !parse_mode(o.positions, generation::parse_position_mode, spec.composition.positions, command,
                  exit_code) ||
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
  spec.composition.row = o.row;
  if (!o.companions.empty()) {
    // Read and checked before any work (issue #35): an empty file, invalid UTF-8, a 100 MB line.
    auto companions = setup::read_prompts(o.companions, "companions file");
    if (!companions.ok()) {
      std::cerr << "batchlens-cli " << command << ": " << companions.error().message << "\n";
      exit_code = kExitUsage;
      return false;
    }
    spec.composition.companions = std::move(companions.value());
    if (o.prefill_option == nullptr || o.prefill_option->count() == 0) {
      spec.prefill = generation::PrefillMode::Batched;  // a server prefills the batch at once
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
  // A spec no run could take (a batch size of 1, an unknown preset) is a bad command line:
  // exit 2 at once, before the model is built (issue #34: exit 1 after ~9 s).
  experiment::ExperimentSpec probe = spec;
  if (!file_out && probe.prompt.empty() && probe.prompt_ids.empty()) {
    probe.prompt = "-";  // a sweep's prompts come from --prompts, checked when read
  }
  if (o.companion_axis && probe.composition.companions.empty()) {
    probe.composition.positions = generation::PositionMode::Shared;  // checked with the axis
  }
  // Text that is not UTF-8 is reported by the checks below, naming the option.
  base::Result<void> usable =
      check_spec_text(spec).ok() ? experiment::validate(probe) : base::ok_result();
  if (usable.ok() && !spec.model.preset.empty()) {
    if (auto preset = model::load_preset(spec.model.preset); !preset.ok()) {
      usable = preset.error();
    }
  }
  if (!usable.ok()) {
    std::cerr << "batchlens-cli " << command << ": " << usable.error().message << "\n";
    exit_code = kExitUsage;
    return false;
  }
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

namespace {

// BATCHLENS_TRACE=FILE: the computation under LibTorch's profiler (host ops and CUDA kernels), a
// Chrome trace written to FILE (tools/trace_summary.py reads it). Kernel provenance runs a
// profiler of its own, so the two do not mix.
base::Result<experiment::ExperimentResult> traced(
    const SpecOptions& o,
    const std::function<base::Result<experiment::ExperimentResult>()>& compute) {
  const char* path = std::getenv("BATCHLENS_TRACE");  // NOLINT(concurrency-mt-unsafe): read-only
  if (path == nullptr || *path == '\0') {
    return compute();
  }
  if (!compat::profiler_available()) {
    return base::Error{base::ErrorCode::DeviceUnavailable,
                       "BATCHLENS_TRACE: this build has no kernel profiler (CUDA builds only)"};
  }
  if (o.spec.kernels) {
    return base::Error{base::ErrorCode::InvalidArgument,
                       "BATCHLENS_TRACE: kernel provenance profiles too; add --no-kernels"};
  }
  // Complete or not at all, like every file BatchLens writes; a folder it cannot write to is
  // refused before the computation starts.
  std::optional<base::AtomicFile> file;
  const auto opened = base::guarded([&] {
    file.emplace(path);
    return true;
  });
  if (!opened.ok()) {
    return base::Error{opened.error().code, "BATCHLENS_TRACE: " + opened.error().message};
  }
  base::Result<experiment::ExperimentResult> result = base::Error{};
  const auto written = base::guarded([&] {
    compat::profile_to_file(file->temp_path().string(), [&] { result = compute(); });
    file->commit();
    return true;
  });
  if (written.ok()) {
    std::fprintf(stderr, "batchlens: trace written to %s\n", path);
  } else if (result.ok()) {
    // The run's result is kept: only its trace is lost.
    std::fprintf(stderr, "batchlens: no trace written to %s (%s)\n", path,
                 written.error().message.c_str());
  }
  return result;
}

}  // namespace

// Runs `compute` under Ctrl-C cancellation with progress, prints the summary and writes the
// file (or rescues it); sets the exit code.
void compute_and_write(
    const SpecOptions& o,
    const std::function<base::Result<experiment::ExperimentResult>(const experiment::RunControl&)>&
        compute,
    int& exit_code) {
  base::Result<experiment::ExperimentResult> result = base::Error{};
  // Process start to here: loading the libraries, CUDA's start, parsing and checks (issue #37
  // counts the whole process; the time line below says what the run's own parts leave out).
  const double before_run_s = base::seconds_since_process_start();
  progress_event(o.progress, "start", {{"pid", static_cast<std::int64_t>(::getpid())}});
  {
    const SigintCancel sigint;
    experiment::RunControl control;
    control.cancel = sigint.token();
    control.progress = progress_reporter(o.progress);
    result = traced(o, [&] { return compute(control); });
  }
  if (o.progress != "json") {
    std::fprintf(stderr, "\n");
  }
  if (!result.ok()) {
    progress_event(
        o.progress, "error",
        {{"code", base::to_string(result.error().code)}, {"message", result.error().message}});
    exit_code = report_error(result.error());
    return;
  }
  const fs::path out = o.out;
  const auto write_start = std::chrono::steady_clock::now();
  const auto written = write_or_rescue(out, result.value(), o.write);
  const double write_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - write_start).count();
  const auto& t = result.value().timings;
  std::cout << analysis::summary_text(result.value()) << "\n";
  if (written.empty()) {
    exit_code = kExitFailure;
    return;
  }
  std::cout << "wrote " << written.string() << "\n"
            << std::fixed << std::setprecision(2) << "time: tokenizer and inputs " << t.prepare_s
            << " s, load " << t.load_s << " s, engines " << t.engines_s
            << " s, per-tick copies and comparisons " << t.comparisons_s
            << " s (read back per canvas " << t.readback_s << " s), results " << t.results_s
            << " s, kernel provenance " << t.kernels_s << " s, causes " << t.causes_s
            << " s, exact reference " << t.exact_s << " s, file " << write_s << " s";
  if (const double process_s = base::seconds_since_process_start();
      before_run_s >= 0.0 && process_s >= before_run_s) {
    // What the parts above leave out shows as the process's rest: its start-up before the run,
    // and inside the run the session's set-up (checks, graphs, plans) and the summary.
    std::cout << "; process " << process_s << " s (start-up before the run " << before_run_s
              << " s)";
  }
  std::cout << "\n";
  if (written == out && o.progress == "json") {
    auto digest = base::sha256_file(out);
    std::error_code ec;
    progress_event(o.progress, "written",
                   {{"path", fs::absolute(out, ec).string()},
                    {"bytes", static_cast<std::uint64_t>(fs::file_size(out, ec))},
                    {"sha256", digest.ok() ? digest.value() : std::string()}});
  }
  // A rescued result is kept, but the command did not do what it was asked.
  exit_code = written == out ? kExitOk : kExitFailure;
}

base::ProgressFn progress_reporter(const std::string& mode) {
  if (mode != "json") {
    return draw_progress;
  }
  return [](const base::Progress& p) {
    progress_event("json", "progress",
                   {{"done", p.done},
                    {"total", p.total},
                    {"stage", p.stage},
                    {"elapsed_s", p.elapsed_s},
                    {"eta_s", p.eta_s}});
  };
}

void progress_event(const std::string& mode, const std::string& name, nlohmann::json fields) {
  if (mode != "json") {
    return;
  }
  fields["event"] = name;
  const std::string line = base::dump_json_lossy(fields) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace batchlens::cli
