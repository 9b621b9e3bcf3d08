// SPDX-License-Identifier: Apache-2.0
// The experiment-spec options that `run`, `culprit` and `sweep` share: declared on a command,
// resolved into a typed ExperimentSpec with the checks before any work, and the common way to
// compute a result under Ctrl-C with progress and write it (or rescue it).
#pragma once

#include <functional>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "app/cli/model_options.h"
#include "core/base/error.h"
#include "core/experiment/experiment.h"
#include "core/experiment/runner.h"
#include "core/io/experiment_file.h"

namespace batchlens::cli {

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
  /// sweep --companion-sets: the companions come with the axis, after these checks (per_row
  /// positions without --companions are then not refused here).
  bool companion_axis = false;
  std::string prefill = "copied";
  CLI::Option* prefill_option = nullptr;  // given: kept as given, even beside companions
  std::string companions;                 // a prompt file: the other rows (issue #35)
  std::int64_t row = 0;
  std::string positions = "shared";
  std::string mode = "free";
  bool raw = false;
  bool no_kernels = false;
  bool no_causes = false;  // run: skip the re-runs that tell a mixed batch's causes apart
  bool no_exact = false;   // run: skip the exact (fp64) reference at the first divergences
  // The whole spec as JSON (a file, or "-" for stdin: `remote` sends it so, issue #36): the
  // options above that describe the spec are then not read.
  std::string spec_json;
  std::string progress = "bar";  // "json": progress and events as JSON lines on stderr
};

/// Declares the spec options on `cmd` (with --workaround when `workaround`).
void add_spec_options(CLI::App* cmd, SpecOptions& o, bool workaround,
                      const char* out_help = "Experiment file to write (.h5)");

/// Fills o.spec from the typed options and runs the checks before any work (with `file_out`,
/// those of --out too). False (with the exit code set and the reason printed) when the command
/// must not start.
bool resolve_spec(SpecOptions& o, const char* command, int& exit_code, bool file_out = true);

/// The progress reporter of --progress: the terminal bar, or one JSON line per report on stderr
/// ({"event": "progress", "done", "total", "stage", "elapsed_s", "eta_s"}) for a program that
/// drives this one (the `remote` command over SSH).
base::ProgressFn progress_reporter(const std::string& mode);
/// With --progress json: one {"event": NAME, ...fields} line on stderr; nothing otherwise.
void progress_event(const std::string& mode, const std::string& name, nlohmann::json fields);

/// Runs `compute` under Ctrl-C cancellation with progress, prints the summary and writes the
/// file (or rescues it); sets the exit code. With --progress json the written file's path,
/// size and SHA-256 follow as an event ("written").
void compute_and_write(
    const SpecOptions& o,
    const std::function<base::Result<experiment::ExperimentResult>(const experiment::RunControl&)>&
        compute,
    int& exit_code);

}  // namespace batchlens::cli
