// SPDX-License-Identifier: Apache-2.0
// A sweep's spec (issue #19): one experiment spec over many prompts and seeds, "how often does
// the batch size change the text": the spec and its JSON, its id, its items (prompt x seed) and
// shards, and the command line's seed lists and prompt files. Running it is sweep_records.h.
// Torch-free header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/base/error.h"
#include "core/experiment/experiment.h"
#include "core/setup/prompt.h"

namespace batchlens::analysis {

/// What a sweep runs: `base` (model, load, batch sizes, policy, workaround, mode, generation
/// overrides, taps) for every prompt × seed. Its prompt and seed are the item's; its repeats are
/// 0 (the sweep asks "does B change the text", the noise floor is per experiment) and no kernel
/// provenance is recorded.
struct SweepSpec {
  experiment::ExperimentSpec base;
  std::vector<setup::Prompt> prompts;
  std::vector<std::uint64_t> seeds{0};
  /// Issue #35's axes of a mixed batch: the other rows' prompts, one set per value (an empty set:
  /// identical rows), and the row that holds the prompt under test; base.composition keeps only
  /// the positions (its companions and row are these axes': normalize_axes).
  std::vector<std::vector<setup::Prompt>> companion_sets{{}};
  std::vector<std::int64_t> rows{0};

  /// Whether the sweep varies the companions or the row (or runs beside companions at all).
  bool mixed() const;
  /// base.composition's companions and row moved into the axes when the axes are the default
  /// (a spec built from one run's options).
  void normalize_axes();
};

/// One item: a prompt, a seed, a set of companions and a row. Items are numbered prompt-major:
/// index = ((p * seeds + s) * companion_sets + c) * rows + r (a sweep without the axes keeps
/// p * seeds + s).
struct SweepItem {
  int index = 0;
  int prompt = 0;
  std::uint64_t seed = 0;
  int companions = 0;    ///< index into companion_sets
  std::int64_t row = 0;  ///< the row under test (a value of rows)
};

/// A slice of the items for one process of several (a Slurm array task): items whose index
/// modulo `count` is `index`.
struct Shard {
  int index = 0;
  int count = 1;
};

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
experiment::ExperimentSpec item_spec(const SweepSpec& spec, const SweepItem& item);
bool in_shard(const SweepItem& item, const Shard& shard);

/// A sweep as a person gives it (the CLI's sweep options, the GUI's Run sweep dialog).
struct SweepInput {
  experiment::ExperimentSpec base;  ///< every item's spec (its prompt, seed, companions, row:
                                    ///< the defaults of the axes below)
  std::string prompts_file;         ///< one prompt per line or JSON Lines; "": base's prompt alone
  std::string seeds;                ///< "0-23", "0,5,9-11"; "": base's seed
  /// Companions files, comma-separated, "none" for identical rows; "": base's companions.
  std::string companion_sets;
  std::string rows;  ///< "0,3"; "": base's row
};

/// The sweep `in` describes, its files read and checked. InvalidArgument naming the field
/// (a seed list, a row list, the whole sweep as validate()); the prompt files' own errors
/// (FileNotFound, FileCorrupted, ...) with the file named. Never throws.
base::Result<SweepSpec> sweep_from_input(const SweepInput& in);

/// "0-23", "0,5,9-11": seeds, ascending, each once. InvalidArgument on anything else or more
/// than 100000 seeds. Never throws.
base::Result<std::vector<std::uint64_t>> parse_seeds(const std::string& text);

}  // namespace batchlens::analysis
