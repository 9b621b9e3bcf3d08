// SPDX-License-Identifier: Apache-2.0
// A sweep run here, to its file: the model loaded once, the items (of one shard, or all) run with
// their records committed to the sweep folder one by one, then the sweep file written from the
// folder. The one front door of `batchlens-cli sweep` and the GUI's Run sweep. Torch-free header.
#pragma once

#include <filesystem>

#include "core/analysis/sweep_records.h"
#include "core/analysis/sweep_spec.h"
#include "core/base/error.h"
#include "core/experiment/runner.h"

namespace batchlens::io {

/// What run_sweep_to_file did.
struct SweepFileRun {
  analysis::SweepOutcome outcome;
  analysis::SweepRecords records;  ///< what the file holds (the shard's, or all)
  std::filesystem::path file;
};

/// Runs `sweep` as analysis::run_sweep does (options.dir, options.shard, options.keep: the items
/// finished before are skipped), then writes its rows to options.dir/sweep.h5, or with
/// `shard_file` to the shard's file (analysis::shard_file) for a merge job. Errors: those of
/// loading the model, of the run (Cancelled: the items finished stay) and of writing. Never
/// throws.
base::Result<SweepFileRun> run_sweep_to_file(const analysis::SweepSpec& sweep,
                                             const analysis::SweepRunOptions& options,
                                             bool shard_file,
                                             const experiment::RunControl& control = {});

}  // namespace batchlens::io
