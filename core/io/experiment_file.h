// SPDX-License-Identifier: Apache-2.0
// BatchLens experiment files: HDF5, versioned schema (docs/file-format.md). Torch-free.
#pragma once

#include <filesystem>

#include "core/base/error.h"
#include "core/experiment/experiment.h"

namespace batchlens::io {

inline constexpr const char* kFormat = "batchlens-experiment";
inline constexpr int kSchemaMajor = 1;  ///< readers refuse other majors
inline constexpr int kSchemaMinor = 1;  ///< additions that old readers may ignore

/// Writes `result` to `path` through a temporary file beside it, renamed into place when
/// complete: a crash or an error never leaves a partial file at `path`. Large arrays are
/// chunked and gzip-compressed on up to 16 threads: the calling one and helpers it starts and
/// joins before returning (BATCHLENS_HDF5_SERIAL=1: the calling thread alone, through HDF5's
/// filter pipeline).
/// Errors: IoFailed (with the HDF5, zlib or system reason). Never throws.
base::Result<void> write_experiment(const std::filesystem::path& path,
                                    const experiment::ExperimentResult& result);

/// Reads and validates a file. Errors: FileNotFound; FileUnrecognised (not HDF5, or an HDF5
/// file of another kind); FileIncompatibleVersion (schema major != kSchemaMajor);
/// FileCorrupted (truncated, a missing group/dataset/attribute or a shape that does not fit,
/// named in the message). Never throws, never crashes on bad input.
base::Result<experiment::ExperimentResult> read_experiment(const std::filesystem::path& path);

}  // namespace batchlens::io
