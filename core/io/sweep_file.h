// SPDX-License-Identifier: Apache-2.0
// Sweep files (issue #19): a sweep's rows, one per item, group and batch size, with its spec and
// where each row was computed, as HDF5 that h5py reads without BatchLens (docs/file-format.md,
// "Sweep files"). A sweep run writes one per shard; batchlens-cli sweep-merge merges them.
// Torch-free.
#pragma once

#include <filesystem>

#include "core/analysis/sweep_records.h"
#include "core/base/error.h"

namespace batchlens::io {

inline constexpr const char* kSweepFileFormat = "batchlens-sweep";
inline constexpr int kSweepSchemaMajor = 1;  ///< readers refuse other majors
inline constexpr int kSweepSchemaMinor = 0;

/// Writes `s` (checked with experiment::validate first) through a base::AtomicFile beside `path`,
/// built in memory, verified by reading it back, then renamed into place: nothing half written is
/// ever at `path`. Errors: InvalidArgument (inconsistent records), IoFailed. Never throws.
base::Result<void> write_sweep_file(const std::filesystem::path& path,
                                    const analysis::SweepRecords& s);

/// Reads and checks a sweep file: every attribute and dataset's class, rank, length and size is
/// checked before it is read; the records are then checked as a whole (experiment::validate).
/// Errors: FileNotFound; FileUnrecognised (not HDF5, or HDF5 of another kind: an experiment file
/// reads FileUnrecognised here); FileIncompatibleVersion; FileCorrupted naming what does not fit.
/// Never throws.
base::Result<analysis::SweepRecords> read_sweep_file(const std::filesystem::path& path);

/// Whether `path` is a readable HDF5 file whose root says it is a sweep file (format attribute);
/// false for anything else (an experiment file, damaged HDF5, not HDF5). Callers then read it
/// with read_sweep_file or read_experiment. Never throws.
bool is_sweep_file(const std::filesystem::path& path);

/// A sweep folder (analysis::read_sweep_dir) or a sweep file (read_sweep_file), by what `path`
/// is. Errors as theirs. Never throws.
base::Result<analysis::SweepRecords> read_sweep(const std::filesystem::path& path);

}  // namespace batchlens::io
