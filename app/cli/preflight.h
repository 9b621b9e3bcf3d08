// SPDX-License-Identifier: Apache-2.0
// What `batchlens-cli run` checks before it computes anything, so that an experiment that may
// take hours is never lost to a bad --out, a full disk or text the file cannot hold; and where the
// result goes when the write still fails.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/experiment/experiment.h"

namespace batchlens::cli {

/// InvalidArgument naming the option and the byte offset when a text of `spec` that goes into the
/// experiment file (prompt, policy, workaround, taps, names, checkpoint path) is not valid UTF-8.
base::Result<void> check_spec_text(const experiment::ExperimentSpec& spec);

/// Checks, without opening anything, that `out` can be written as a file: its folder exists, is a
/// folder and this process may create files in it; `out` is absent or a regular file (after
/// symlinks), not a folder, FIFO, device or socket. Errors: InvalidArgument naming the path and
/// the system's reason.
base::Result<void> check_output_path(const std::filesystem::path& out);

/// Bytes an unprivileged writer may still use in the folder that holds `out`, or nullopt when the
/// system does not say.
std::optional<std::uint64_t> free_bytes_for(const std::filesystem::path& out);

/// A rough range of the size of the experiment file `spec` writes. `high`: every array
/// uncompressed at the largest shapes the spec allows (real files measured 1.5x to 40x below it:
/// small experiments are mostly HDF5 structure, large ones compress). `low`: HDF5's structure
/// plus `high` at deflate's best ratio (1:1000); an experiment that stops early may still need
/// less, so `low` only separates "clearly too little space" from "maybe".
struct SizeEstimate {
  std::uint64_t low = 0;
  std::uint64_t high = 0;
};

/// The estimate from the model's config (preset or checkpoint config.json) and the generation
/// settings; nullopt when they cannot be read (the run then reports why).
std::optional<SizeEstimate> estimate_file_size(const experiment::ExperimentSpec& spec);

/// Where a computed result is written when --out fails: `batchlens-rescued-<pid>-<UTC time>.h5`
/// in $TMPDIR, /tmp and $HOME, in that order, each folder once.
std::vector<std::filesystem::path> rescue_paths();

/// "12.3 MiB".
std::string format_bytes(std::uint64_t bytes);

}  // namespace batchlens::cli
