// SPDX-License-Identifier: Apache-2.0
// A sweep's records: what each item (prompt x seed) kept per batch size (SweepRow), the sweep's
// folder (sweep.json and one record per finished item, each committed atomically, so a killed
// sweep run again with the same command skips what is done and loses nothing), running a
// shard's items on one loaded model, and reading a folder back. Torch-free header.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/analysis/sweep_spec.h"
#include "core/base/error.h"
#include "core/experiment/experiment.h"
#include "core/experiment/runner.h"

namespace batchlens::setup {
struct Session;
}

namespace batchlens::analysis {

/// What one item gave at one batch size (row 0 of B against B=1), per group.
struct SweepRow {
  int item = 0;
  int prompt = 0;
  std::uint64_t seed = 0;
  experiment::RunGroup group = experiment::RunGroup::Main;
  int batch_size = 0;
  bool text_changed = false;  ///< row 0's tokens up to the stop differ from B=1's
  std::int64_t tokens_changed = 0;
  std::int64_t tokens_total = 0;  ///< generated tokens of the reference
  bool stop_changed = false;
  bool steps_changed = false;
  // The first divergence (step -1: none): canvas (0-based), step (1-based), layer, tap and the
  // op families behind that tap.
  int first_canvas = -1;
  int first_step = -1;
  int first_layer = -1;
  std::string first_tap;
  std::string first_families;  ///< ops::family_name joined by "+", "" when none
  double wall_s = 0.0;         ///< the item's whole experiment
  /// Where it was computed: an index into SweepRecords::provenances (kept beside the rows, not
  /// in the row's JSON).
  int provenance = 0;
};

/// The rows of one item's experiment: per row-0 comparison (each batch size, each group).
std::vector<SweepRow> sweep_rows(const experiment::ExperimentResult& r, const SweepItem& item,
                                 double wall_s);

nlohmann::json to_json(const SweepRow& row);
/// FileCorrupted naming the field. Never throws.
base::Result<SweepRow> sweep_row_from_json(const nlohmann::json& doc);

/// Where a sweep run keeps its records and what it does besides.
struct SweepRunOptions {
  /// The sweep's folder: sweep.json (the spec and its id) and one record per finished item
  /// (items/item-<index>.json). Made when missing; a folder of another sweep is refused.
  std::filesystem::path dir;
  Shard shard;
  /// Called with each finished item's full experiment before its record is committed (the CLI's
  /// --keep-experiments writes it to a file); an error stops the sweep. Optional.
  std::function<base::Result<void>(const SweepItem&, const experiment::ExperimentResult&)> keep;
};

/// Where --keep-experiments keeps an item's full experiment: DIR/experiments/item-NNNNNN.h5.
std::filesystem::path kept_experiment(const std::filesystem::path& dir, int item);

/// What run_sweep did.
struct SweepOutcome {
  std::string id;
  std::vector<SweepRow> rows;  ///< of every finished item of the shard, the skipped ones too
  int items_run = 0;
  int items_skipped = 0;              ///< finished by an earlier run
  experiment::Provenance provenance;  ///< this process's (host, device, versions)
};

/// Makes `dir` a folder of this sweep: writes dir/sweep.json (the spec and its id) when missing,
/// refuses a folder of another sweep (InvalidArgument). Returns the sweep's id. Never throws.
base::Result<std::string> prepare_sweep_dir(const std::filesystem::path& dir,
                                            const SweepSpec& spec);

/// Runs the shard's items of `spec` on `session`, one experiment each, committing each item's
/// record atomically as it finishes; items with a record are skipped. Progress: one report per
/// denoising tick over the whole shard, with ETA. Errors: InvalidArgument (spec, a folder of
/// another sweep, a record that does not parse), those of run_experiment (Cancelled included:
/// finished items stay committed), IoFailed. Never throws.
base::Result<SweepOutcome> run_sweep(const setup::Session& session, const SweepSpec& spec,
                                     const SweepRunOptions& options,
                                     const experiment::RunControl& control = {});

/// One shard file's part of a sweep (a Slurm array task's): which slice and where it ran.
struct SweepShard {
  int index = 0;
  int count = 1;
  int provenance = 0;  ///< the process that wrote the shard file (index into provenances)
  int items = 0;       ///< finished items of the slice
};

/// What a sweep holds: its spec, id and the rows of its finished items, with where each was
/// computed. A sweep folder, a shard file and a merged sweep file all read into one of these.
struct SweepRecords {
  SweepSpec spec;
  std::string id;
  std::vector<SweepRow> rows;  ///< by item, group, batch size
  int items_done = 0;
  int items_total = 0;
  std::vector<experiment::Provenance> provenances;  ///< distinct, as rows and shards refer to them
  std::vector<SweepShard> shards;  ///< of a shard or merged file; empty for a folder
};

/// The spec of a sweep's folder (its sweep.json, id checked), without reading any record.
/// Errors: InvalidArgument (no sweep.json), FileCorrupted. Never throws.
base::Result<SweepSpec> read_sweep_spec(const std::filesystem::path& dir);

/// The spec and records of a sweep's folder: every record present (any shard). Errors:
/// InvalidArgument / FileCorrupted naming the file. Never throws.
base::Result<SweepRecords> read_sweep_dir(const std::filesystem::path& dir);

/// The index of `p` in `list` (compared as provenance JSON), appended when not there yet.
int provenance_index(std::vector<experiment::Provenance>& list, const experiment::Provenance& p);
/// The order of a sweep's rows: by item, group, batch size.
bool row_before(const SweepRow& a, const SweepRow& b);

}  // namespace batchlens::analysis
