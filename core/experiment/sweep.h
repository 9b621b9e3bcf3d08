// SPDX-License-Identifier: Apache-2.0
// Sweeps (issue #19): one experiment spec over many prompts and seeds on one loaded model, "how
// often does the batch size change the text". Each item (prompt × seed) runs as an experiment
// (its taps compared to find the first divergence); what it keeps per batch size is a SweepRow.
// Every finished item is committed on its own as a record file in the sweep's folder (atomic), so a
// killed sweep run again with the same command skips what is done and loses nothing. Torch-free
// header.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/base/error.h"
#include "core/experiment/experiment.h"
#include "core/experiment/runner.h"

namespace batchlens::setup {
struct Session;
}

namespace batchlens::experiment {

/// One prompt of a sweep: text (through the chat template unless told not) or exact ids.
struct SweepPrompt {
  std::string text;
  bool chat_template = true;
  std::vector<std::int64_t> ids;  ///< used instead of `text` when not empty
};

/// What a sweep runs: `base` (model, load, batch sizes, policy, workaround, mode, generation
/// overrides, taps) for every prompt × seed. Its prompt and seed are the item's; its repeats are
/// 0 (the sweep asks "does B change the text", the noise floor is per experiment) and no kernel
/// provenance is recorded.
struct SweepSpec {
  ExperimentSpec base;
  std::vector<SweepPrompt> prompts;
  std::vector<std::uint64_t> seeds{0};
};

/// One item: a prompt and a seed. Items are numbered prompt-major: index = p * seeds + s.
struct SweepItem {
  int index = 0;
  int prompt = 0;
  std::uint64_t seed = 0;
};

/// A slice of the items for one process of several (a Slurm array task): items whose index
/// modulo `count` is `index`.
struct Shard {
  int index = 0;
  int count = 1;
};

/// What one item gave at one batch size (row 0 of B against B=1), per group.
struct SweepRow {
  int item = 0;
  int prompt = 0;
  std::uint64_t seed = 0;
  std::string group = "main";  ///< "main" or "workaround"
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

/// The host, device and versions of a process that computed rows (host, device, device_name,
/// driver, cuda, cublas, libtorch, tool, dtype as JSON).
nlohmann::json provenance_to_json(const Provenance& p);
/// FileCorrupted naming the field. Never throws.
base::Result<Provenance> provenance_from_json(const nlohmann::json& doc);

/// InvalidArgument naming the first bad field (the base spec as validate(), no prompts, no seeds,
/// more than 1,000,000 items). Never throws.
base::Result<void> validate(const SweepSpec& spec);
nlohmann::json to_json(const SweepSpec& spec);
/// FileCorrupted (or InvalidArgument for a bad base spec) naming the field. Never throws.
base::Result<SweepSpec> sweep_spec_from_json(const nlohmann::json& doc);

/// A digest of everything that decides what a sweep computes (its JSON): records and shards of
/// another sweep carry another id. 16 hex digits.
std::string sweep_id(const SweepSpec& spec);

/// Every item, prompt-major.
std::vector<SweepItem> sweep_items(const SweepSpec& spec);
/// The experiment spec of one item.
ExperimentSpec item_spec(const SweepSpec& spec, const SweepItem& item);
bool in_shard(const SweepItem& item, const Shard& shard);

/// "0-23", "0,5,9-11": seeds, ascending, each once. InvalidArgument on anything else or more
/// than 100000 seeds. Never throws.
base::Result<std::vector<std::uint64_t>> parse_seeds(const std::string& text);

/// Prompts from a file: JSON Lines (every non-empty line an object with "prompt" or
/// "prompt_ids", optional "chat_template") when the first non-empty line starts with '{', else
/// one prompt per non-empty line. InvalidArgument naming the line for bad lines; at most 100000
/// prompts of 1 MiB each. Never throws.
base::Result<std::vector<SweepPrompt>> read_prompts(const std::filesystem::path& path);

/// The rows of one item's experiment: per row-0 comparison (each batch size, each group).
std::vector<SweepRow> sweep_rows(const ExperimentResult& r, const SweepItem& item, double wall_s);

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
  std::function<base::Result<void>(const SweepItem&, const ExperimentResult&)> keep;
};

/// Where --keep-experiments keeps an item's full experiment: DIR/experiments/item-NNNNNN.h5.
std::filesystem::path kept_experiment(const std::filesystem::path& dir, int item);

/// What run_sweep did.
struct SweepOutcome {
  std::string id;
  std::vector<SweepRow> rows;  ///< of every finished item of the shard, the skipped ones too
  int items_run = 0;
  int items_skipped = 0;  ///< finished by an earlier run
  Provenance provenance;  ///< this process's (host, device, versions)
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
                                     const RunControl& control = {});

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
  std::vector<Provenance> provenances;  ///< distinct, as rows and shards refer to them
  std::vector<SweepShard> shards;       ///< of a shard or merged file; empty for a folder
};

/// The spec of a sweep's folder (its sweep.json, id checked), without reading any record.
/// Errors: InvalidArgument (no sweep.json), FileCorrupted. Never throws.
base::Result<SweepSpec> read_sweep_spec(const std::filesystem::path& dir);

/// The spec and records of a sweep's folder: every record present (any shard). Errors:
/// InvalidArgument / FileCorrupted naming the file. Never throws.
base::Result<SweepRecords> read_sweep_dir(const std::filesystem::path& dir);

/// The whole of a sweep's records agree with themselves: the id is the spec's, every row's item,
/// prompt and seed are the spec's, each item's rows are complete and unique, items_done counts
/// them, provenance indexes are in range. FileCorrupted naming the first disagreement.
base::Result<void> validate(const SweepRecords& s);

/// The part of `all` that `shard` covers, as the shard file of a process with `process`
/// provenance records it.
SweepRecords shard_records(const SweepRecords& all, const Shard& shard, const Provenance& process);

/// Merges shard (or merged) files' records into one: every part must hold the same sweep (id and
/// spec), an item found in two parts must have the same rows, a shard may come once. `names`
/// (one per part) name the parts in errors. InvalidArgument naming the part that does not fit.
/// Never throws.
base::Result<SweepRecords> merge_sweeps(const std::vector<SweepRecords>& parts,
                                        const std::vector<std::string>& names);

/// Items of the spec without rows, ascending.
std::vector<int> missing_items(const SweepRecords& s);

/// A binomial share's 95 % interval (Wilson score, z = 1.96).
struct Interval {
  double lo = 0.0;
  double hi = 0.0;
};
Interval wilson_interval(int k, int n);

/// Per group and batch size: how often the text changed, how much, and where it began.
struct SweepStats {
  std::string group;
  int batch_size = 0;
  int n = 0;
  int text_changed = 0;
  Interval changed_ci;
  double tokens_changed_median = 0.0;
  std::int64_t tokens_changed_max = 0;
  int stop_changed = 0;
  int steps_changed = 0;
  int diverged = 0;                                ///< a first divergence was found
  std::map<std::pair<int, int>, int> first_steps;  ///< (canvas 0-based, step 1-based) -> items
  std::map<std::string, int> first_families;       ///< families behind the first tap -> items
};
std::vector<SweepStats> sweep_stats(const std::vector<SweepRow>& rows);

/// The table `batchlens-cli summary` prints for a sweep, and its JSON.
std::string sweep_text(const SweepRecords& s);
nlohmann::json sweep_json(const SweepRecords& s);

}  // namespace batchlens::experiment
