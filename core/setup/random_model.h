// SPDX-License-Identifier: Apache-2.0
// A preset's random weights as a complete HF checkpoint directory (weights, tokenizer, generation
// defaults, config): the setup layer owns it because it brings model, text and sampling
// together. Torch-free header.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "core/base/error.h"

namespace batchlens::setup {

/// Writes a preset's weights as an HF-style checkpoint directory. A trained preset's bundled files
/// are written as they are (seed and shard size ignored). Otherwise: safetensors shards of
/// at most `max_shard_bytes`, the preset's generated tokenizer.json, the released
/// generation_config.json and config.json, e.g. to hand the same model to the transformers
/// reference. The folder is built beside `dir` and moved into place complete (base::AtomicDir):
/// on any failure nothing is left at `dir`. `dir` must not exist or be an empty folder.
/// `fail_after_files` (tests only) makes it fail after writing that many files. Never throws.
base::Result<void> save_random_model(const std::string& preset, std::uint64_t seed,
                                     const std::filesystem::path& dir,
                                     std::uint64_t max_shard_bytes = 4ULL << 30,
                                     int fail_after_files = -1);

}  // namespace batchlens::setup
