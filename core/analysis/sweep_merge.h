// SPDX-License-Identifier: Apache-2.0
// A sweep's records checked and combined: validation of a whole set of records, the slice a
// shard file holds, merging shard files into one sweep, and the items still missing.
#pragma once

#include <string>
#include <vector>

#include "core/analysis/sweep_records.h"
#include "core/base/error.h"

namespace batchlens::analysis {

/// The whole of a sweep's records agree with themselves: the id is the spec's, every row's item,
/// prompt and seed are the spec's, each item's rows are complete and unique, items_done counts
/// them, provenance indexes are in range. FileCorrupted naming the first disagreement.
base::Result<void> validate(const SweepRecords& s);

/// The part of `all` that `shard` covers, as the shard file of a process with `process`
/// provenance records it.
SweepRecords shard_records(const SweepRecords& all, const Shard& shard,
                           const experiment::Provenance& process);

/// Merges shard (or merged) files' records into one: every part must hold the same sweep (id and
/// spec), an item found in two parts must have the same rows, a shard may come once. `names`
/// (one per part) name the parts in errors. InvalidArgument naming the part that does not fit.
/// Never throws.
base::Result<SweepRecords> merge_sweeps(const std::vector<SweepRecords>& parts,
                                        const std::vector<std::string>& names);

/// Items of the spec without rows, ascending.
std::vector<int> missing_items(const SweepRecords& s);

}  // namespace batchlens::analysis
