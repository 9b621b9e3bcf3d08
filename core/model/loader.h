// SPDX-License-Identifier: Apache-2.0
// Building a DiffusionGemma from a preset or a checkpoint directory: what the CLI, the GUI and
// the experiment runner call. Torch-free header.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/base/cancel.h"
#include "core/base/error.h"
#include "core/base/progress.h"
#include "core/base/switches.h"

namespace batchlens::model {

class DiffusionGemma;
struct ModelConfig;

/// Where the model comes from: a shipped preset with seeded random weights, or a checkpoint
/// directory (config.json + model.safetensors or a sharded index). Exactly one is set.
struct ModelSource {
  std::string preset;                    ///< "tiny", "demo", "mid", "26b-a4b"
  std::filesystem::path checkpoint_dir;  ///< HF-style directory
  std::uint64_t seed = 0;                ///< random-weight seed (presets)

  /// "preset demo (seed 0)" or the directory.
  std::string describe() const;
};

/// What will run on the model, for the memory check before it is loaded. Fields left at 0 take
/// the defaults: one row, a 64-token prompt, one canvas of new tokens.
struct Workload {
  std::int64_t rows = 1;       ///< rows alive at once, summed over the engines that coexist
  std::int64_t max_batch = 1;  ///< the largest batch of one forward pass
  std::int64_t prompt_tokens = 0;
  std::int64_t new_tokens = 0;
};

/// Bytes a model needs on its device, by what holds them. An estimate (within tens of percent):
/// enough to refuse a load that cannot fit instead of being killed by the OOM killer halfway.
struct MemoryEstimate {
  std::uint64_t weights = 0;      ///< the parameters, in the run dtype
  std::uint64_t loading = 0;      ///< transient while one tensor is built or converted (fp32)
  std::uint64_t kv_cache = 0;     ///< encoder K/V of every row over the whole sequence
  std::uint64_t logits = 0;       ///< self-conditioning logits [rows, C, V] + one step's fp32
                                  ///< [B, C, V] temporaries (softmax, entropy, sampling)
  std::uint64_t activations = 0;  ///< one layer's activations and attention scores
  std::uint64_t runtime = 0;      ///< a fixed allowance for the runtime and fragmentation
  std::int64_t rows = 0;          ///< the workload it was computed for
  std::int64_t sequence = 0;      ///< prompt + generated tokens
  std::string dtype;              ///< "bf16" / "fp32"

  std::uint64_t total() const {
    return weights + loading + kv_cache + logits + activations + runtime;
  }
  /// "about 52.1 GiB (weights 48.3 GiB bf16, loading 2.8 GiB, KV cache 0.1 GiB, logits 2.3 GiB,
  /// activations 0.1 GiB, runtime 0.3 GiB; 1 row(s) x 512 tokens)".
  std::string describe() const;
};

/// Memory a new allocation can take on a device now, and where the number comes from.
struct FreeMemory {
  std::uint64_t bytes = 0;
  std::string source;  ///< e.g. "MemAvailable in /proc/meminfo", "cgroup memory limit"
};

/// Free memory of a device: for "cpu" the smaller of MemAvailable (/proc/meminfo) and what the
/// process's cgroup memory limit leaves (v1 or v2, page cache counted as free); for CUDA
/// devices cudaMemGetInfo's free bytes after LibTorch's cached blocks are released. nullopt
/// when it cannot be told (then nothing is refused).
using FreeMemoryFn = std::function<std::optional<FreeMemory>(const std::string& device)>;
std::optional<FreeMemory> query_free_memory(const std::string& device);

/// The estimate for `config` run in `dtype` ("bf16"/"fp32") on `workload`. Never throws.
MemoryEstimate estimate_memory(const ModelConfig& config, const std::string& dtype,
                               const Workload& workload = {});

/// OutOfMemory when `estimate` exceeds what `free_memory` (query_free_memory when empty)
/// reports for `device`, naming `what`, the estimate and the free memory. Never throws.
base::Result<void> check_memory(const MemoryEstimate& estimate, const std::string& what,
                                const std::string& device, const FreeMemoryFn& free_memory = {});

/// How to place and compute the model.
struct LoadOptions {
  std::string device = "cpu";     ///< "cpu", "cuda", "cuda:N"
  std::string dtype = "bf16";     ///< "bf16" or "fp32" (fp32 on CPU only)
  std::string experts = "eager";  ///< "eager" or "grouped_mm"
  /// Fused kernels and CUDA graphs (base::Switches::from_environment() at the program's edge).
  base::Switches switches;
  base::ProgressFn progress;  ///< per tensor loaded
  const base::CancelToken* cancel = nullptr;
  Workload workload;         ///< for the memory check (not part of a spec)
  FreeMemoryFn free_memory;  ///< empty: query_free_memory (tests inject one)
};

/// Loads or builds the model. Before anything is allocated, the memory the model and `workload`
/// need (estimate_memory) is checked against the device's free memory (check_memory).
/// Errors: InvalidArgument (bad preset/dtype/experts name, both or neither source set),
/// DeviceUnavailable (no such CUDA device), FileNotFound / FileUnrecognised / FileCorrupted
/// (checkpoint), OutOfMemory (the estimate does not fit, or an allocation failed), Cancelled.
/// Never throws.
base::Result<std::shared_ptr<const DiffusionGemma>> load_model(const ModelSource& source,
                                                               const LoadOptions& options);

}  // namespace batchlens::model
