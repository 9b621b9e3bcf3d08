// SPDX-License-Identifier: Apache-2.0
// What a sweep runs, as the command line gives it: `sweep` and `remote TARGET sweep` share the
// options (the experiment spec's, --prompts, --seeds, the axes, or --sweep-json) and the one
// function that turns them into an analysis::SweepSpec.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "app/cli/spec_options.h"
#include "core/analysis/sweep_spec.h"

namespace batchlens::cli {

struct SweepOptions {
  SpecOptions spec;
  std::string prompts;
  std::string seeds;
  std::string companion_sets;  // issue #35's axes
  std::string rows;
  /// The whole sweep as JSON (analysis::to_json of a SweepSpec), from a file or stdin ("-"):
  /// what `remote TARGET sweep` sends; the options above are then not read.
  std::string sweep_json;
  std::string shard;
  bool keep = false;
  bool resume = false;
  // --slurm: write a job array instead of running.
  std::string slurm;
  int shards = 0;
  int array_parallel = 0;
  int gpus_per_task = 1;
  std::vector<std::string> sbatch_options;
  /// --submit: sbatch the scripts (or follow the jobs submitted before for this sweep);
  /// --wait: then follow them until the merged file is there (Ctrl-C: scancel).
  bool submit = false;
  bool wait = false;
  double poll_s = 20.0;
};

/// The options of what a sweep runs: the experiment spec's (add_spec_options), --prompts,
/// --seeds, --companion-sets, --rows and --sweep-json; `out_help` describes --out.
void add_sweep_spec_options(CLI::App* cmd, SweepOptions& o, const char* out_help);

/// The sweep `o` describes: from --sweep-json, from the spec options, or with --resume the one
/// in --out's sweep.json. Empty (exit code set, reason printed) when it must not start.
std::optional<analysis::SweepSpec> sweep_of(SweepOptions& o, int& exit_code);

}  // namespace batchlens::cli
