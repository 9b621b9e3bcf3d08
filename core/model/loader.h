// SPDX-License-Identifier: Apache-2.0
// Building a DiffusionGemma from a preset or a checkpoint directory: what the CLI, the GUI and
// the experiment runner call. Torch-free header.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "core/base/cancel.h"
#include "core/base/error.h"
#include "core/base/progress.h"

namespace batchlens::model {

class DiffusionGemma;

/// Where the model comes from: a shipped preset with seeded random weights, or a checkpoint
/// directory (config.json + model.safetensors or a sharded index). Exactly one is set.
struct ModelSource {
  std::string preset;                    ///< "tiny", "demo", "mid", "26b-a4b"
  std::filesystem::path checkpoint_dir;  ///< HF-style directory
  std::uint64_t seed = 0;                ///< random-weight seed (presets)

  /// "preset demo (seed 0)" or the directory.
  std::string describe() const;
};

/// How to place and compute the model.
struct LoadOptions {
  std::string device = "cpu";     ///< "cpu", "cuda", "cuda:N"
  std::string dtype = "bf16";     ///< "bf16" or "fp32" (fp32 on CPU only)
  std::string experts = "eager";  ///< "eager" or "grouped_mm"
  base::ProgressFn progress;      ///< per tensor loaded
  const base::CancelToken* cancel = nullptr;
};

/// Loads or builds the model. Errors: InvalidArgument (bad preset/dtype/experts name, both or
/// neither source set), DeviceUnavailable (no such CUDA device), FileNotFound / FileCorrupted
/// (checkpoint), OutOfMemory, Cancelled. Never throws.
base::Result<std::shared_ptr<const DiffusionGemma>> load_model(const ModelSource& source,
                                                               const LoadOptions& options);

/// Writes a preset's random weights as an HF-style checkpoint directory: safetensors shards of
/// at most `max_shard_bytes`, the preset's generated tokenizer.json, the released
/// generation_config.json and config.json (written last), e.g. to hand the same model to the
/// transformers reference. Every file is written atomically. Never throws.
base::Result<void> save_random_model(const std::string& preset, std::uint64_t seed,
                                     const std::filesystem::path& dir,
                                     std::uint64_t max_shard_bytes = 4ULL << 30);

}  // namespace batchlens::model
