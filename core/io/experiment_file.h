// SPDX-License-Identifier: Apache-2.0
// BatchLens experiment files: HDF5, versioned schema (docs/file-format.md). Torch-free.
#pragma once

#include <filesystem>

#include "core/base/error.h"
#include "core/experiment/experiment.h"

namespace batchlens::io {

inline constexpr const char* kFormat = "batchlens-experiment";
inline constexpr int kSchemaMajor = 1;  ///< readers refuse other majors
inline constexpr int kSchemaMinor = 7;  ///< additions old readers may ignore (1.7: /exact)

/// Writes `result` to `path` through a base::AtomicFile beside it, renamed into place only after
/// every HDF5 write, the flush and the close succeeded and the file read back whole: a crash, an
/// error (ENOSPC named), SIGINT or SIGTERM never leaves a partial file at `path` nor replaces a
/// good one. Schema 1.2: fixed-length strings (every byte kept), Fletcher-32 on every dataset,
/// a checksum over each group's attributes, HDF5 1.10 file-format objects (checksummed metadata).
/// How a file is written, never what: the same bytes either way.
struct WriteOptions {
  /// Compress on the calling thread alone, through HDF5's own filter pipeline (slower; kept to
  /// compare against). BATCHLENS_HDF5_SERIAL=1.
  bool serial = false;
  /// Test hook (docs/reliability.md): hold the writer this long once its temporary exists, so
  /// tests can deliver signals while a write is in flight. BATCHLENS_TEST_WRITE_PAUSE_MS=N.
  int test_pause_ms = 0;

  /// The two variables, read now: call it where the program starts or takes its options.
  static WriteOptions from_environment();
};

/// Large arrays are chunked and gzip-compressed on up to 16 threads: the calling one and helpers it
/// starts and joins before returning (`options.serial`: the calling thread alone, through HDF5's
/// filter pipeline). Errors: IoFailed (with the HDF5, zlib or system reason). Never throws.
base::Result<void> write_experiment(const std::filesystem::path& path,
                                    const experiment::ExperimentResult& result,
                                    const WriteOptions& options = {});

/// Reads and validates a file. Errors: FileNotFound; FileUnrecognised (not HDF5, or an HDF5
/// file of another kind); FileIncompatibleVersion (schema major != kSchemaMajor);
/// FileCorrupted (truncated, a missing group/dataset/attribute, a shape, type or size that does
/// not fit, a checksum that does not match, or datasets that disagree with each other: named in
/// the message). Every attribute and dataset is checked before it is read; sizes are bounded by
/// the file's size and a ceiling. Reads schema 1.0 to 1.2. Never throws, never crashes on bad
/// input; refuses FIFOs, devices and folders without blocking.
base::Result<experiment::ExperimentResult> read_experiment(const std::filesystem::path& path);

}  // namespace batchlens::io
