// SPDX-License-Identifier: Apache-2.0
#include "core/model/loader.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <system_error>
#include <vector>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#ifdef BL_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include "core/kernels/fused_ops.h"
#include "core/model/config.h"
#include "core/model/diffusion_gemma.h"
#include "core/model/safetensors.h"
#include "core/model/weights.h"

namespace batchlens::model {

std::string ModelSource::describe() const {
  if (!preset.empty()) {
    if (preset_bundle(preset).trained()) {
      return "preset " + preset + " (trained weights)";
    }
    return "preset " + preset + " (random weights, seed " + std::to_string(seed) + ")";
  }
  return "checkpoint " + checkpoint_dir.string();
}

namespace {

at::Device parse_device(const std::string& name) {
  if (name == "cpu") {
    return at::kCPU;
  }
  if (name.rfind("cuda", 0) == 0) {
    if (!at::hasCUDA()) {
      base::raise(base::ErrorCode::DeviceUnavailable,
                  "device '" + name + "': this build or machine has no CUDA");
    }
    int index = 0;
    if (name.size() > 4) {
      if (name[4] != ':' || name.size() == 5 ||
          name.find_first_not_of("0123456789", 5) != std::string::npos) {
        base::raise(base::ErrorCode::InvalidArgument,
                    "device '" + name + "': expected cpu, cuda or cuda:N");
      }
      index = std::stoi(name.substr(5));
    }
    const auto count = static_cast<int>(torch::cuda::device_count());
    if (index >= count) {
      base::raise(base::ErrorCode::DeviceUnavailable,
                  "device '" + name + "': only " + std::to_string(count) + " CUDA device(s)");
    }
    return {at::kCUDA, static_cast<c10::DeviceIndex>(index)};
  }
  base::raise(base::ErrorCode::InvalidArgument,
              "device '" + name + "': expected cpu, cuda or cuda:N");
}

at::ScalarType parse_dtype(const std::string& name, const at::Device& device) {
  if (name == "bf16" || name == "bfloat16") {
    return at::kBFloat16;
  }
  if (name == "fp32" || name == "float32") {
    if (!device.is_cpu()) {
      base::raise(base::ErrorCode::InvalidArgument,
                  "dtype fp32 is for CPU checks; the GPU engine runs bf16 as the reference");
    }
    return at::kFloat;
  }
  base::raise(base::ErrorCode::InvalidArgument, "dtype '" + name + "': expected bf16 or fp32");
}

ExpertsImpl parse_experts(const std::string& name) {
  if (name == "eager") {
    return ExpertsImpl::Eager;
  }
  if (name == "grouped_mm") {
    return ExpertsImpl::GroupedMm;
  }
  base::raise(base::ErrorCode::InvalidArgument,
              "experts '" + name + "': expected eager or grouped_mm");
}

}  // namespace

// ---- Memory ------------------------------------------------------------------------------

namespace {

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;
constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::int64_t kDefaultPromptTokens = 64;
// Full-size [B, C, V] fp32 tensors alive at once in one denoising step: the soft-capped logits,
// the tempered copy, softmax probabilities, the entropy's normalised logits, probabilities and
// product, and the sampler's working copy (measured peak on CPU: 6-7).
constexpr std::uint64_t kStepLogitCopies = 8;

std::string gib(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB",
                static_cast<double>(bytes) / static_cast<double>(kGiB));
  return buf;
}

std::uint64_t u(std::int64_t v) {
  return v > 0 ? static_cast<std::uint64_t>(v) : 0;
}

/// "key: <number> kB" of /proc/meminfo, in bytes.
std::optional<std::uint64_t> meminfo_field(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      std::istringstream fields(line.substr(key.size() + 1));
      std::uint64_t kb = 0;
      if (fields >> kb) {
        return kb * 1024;
      }
    }
  }
  return std::nullopt;
}

/// The first number in a small file (cgroup files; "max" reads as nothing).
std::optional<std::uint64_t> read_number(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::uint64_t v = 0;
  if (in >> v) {
    return v;
  }
  return std::nullopt;
}

/// `key <number>` of a cgroup memory.stat.
std::optional<std::uint64_t> stat_field(const std::filesystem::path& path, const std::string& key) {
  std::ifstream in(path);
  std::string name;
  std::uint64_t v = 0;
  while (in >> name >> v) {
    if (name == key) {
      return v;
    }
  }
  return std::nullopt;
}

/// What the process's cgroup memory limit leaves: limit - (usage - inactive page cache), the
/// smallest over the process's own cgroup and the root of the mount (a container's own limit).
/// cgroup v2 (memory.max) and v1 (memory.limit_in_bytes).
std::optional<std::uint64_t> cgroup_available() {
  std::vector<std::string> v1_paths{""};
  std::vector<std::string> v2_paths{""};
  {
    std::ifstream in("/proc/self/cgroup");
    std::string line;
    while (std::getline(in, line)) {
      const auto a = line.find(':');
      const auto b = a == std::string::npos ? a : line.find(':', a + 1);
      if (b == std::string::npos) {
        continue;
      }
      const std::string controllers = line.substr(a + 1, b - a - 1);
      const std::string path = line.substr(b + 1);
      if (line.compare(0, a, "0") == 0 && controllers.empty()) {
        v2_paths.push_back(path);
      } else if (controllers.find("memory") != std::string::npos) {
        v1_paths.push_back(path);
      }
    }
  }
  std::optional<std::uint64_t> best;
  const auto consider = [&best](std::optional<std::uint64_t> limit,
                                std::optional<std::uint64_t> usage,
                                std::optional<std::uint64_t> inactive) {
    // "No limit" is reported as max (v2) or a number near 2^63 (v1).
    if (!limit || !usage || *limit >= (std::uint64_t{1} << 60)) {
      return;
    }
    const std::uint64_t used = *usage - std::min(*usage, inactive.value_or(0));
    const std::uint64_t left = *limit > used ? *limit - used : 0;
    best = best ? std::min(*best, left) : left;
  };
  const std::filesystem::path root = "/sys/fs/cgroup";
  for (const auto& p : v2_paths) {
    const auto dir = root / std::filesystem::path(p).relative_path();
    consider(read_number(dir / "memory.max"), read_number(dir / "memory.current"),
             stat_field(dir / "memory.stat", "inactive_file"));
  }
  for (const auto& p : v1_paths) {
    const auto dir = root / "memory" / std::filesystem::path(p).relative_path();
    consider(read_number(dir / "memory.limit_in_bytes"), read_number(dir / "memory.usage_in_bytes"),
             stat_field(dir / "memory.stat", "total_inactive_file"));
  }
  return best;
}

}  // namespace

std::string MemoryEstimate::describe() const {
  return "about " + gib(total()) + " (weights " + gib(weights) + " " + dtype + ", loading " +
         gib(loading) + ", KV cache " + gib(kv_cache) + ", logits " + gib(logits) +
         ", activations " + gib(activations) + ", runtime " + gib(runtime) + "; " +
         std::to_string(rows) + " row(s) x " + std::to_string(sequence) + " tokens)";
}

std::optional<FreeMemory> query_free_memory(const std::string& device) {
  if (device == "cpu") {
    const auto available = meminfo_field("MemAvailable");
    const auto cgroup = cgroup_available();
    if (cgroup && (!available || *cgroup < *available)) {
      return FreeMemory{*cgroup, "left under this process's cgroup memory limit"};
    }
    if (available) {
      return FreeMemory{*available, "MemAvailable in /proc/meminfo"};
    }
    return std::nullopt;
  }
#ifdef BL_WITH_CUDA
  try {
    if (device.rfind("cuda", 0) != 0 || !at::hasCUDA()) {
      return std::nullopt;
    }
    const int index = device.size() > 5 ? std::stoi(device.substr(5)) : 0;
    // Blocks LibTorch keeps cached (a model loaded earlier and released) count as free.
    c10::cuda::CUDACachingAllocator::emptyCache();
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return std::nullopt;
    }
    return FreeMemory{static_cast<std::uint64_t>(free_bytes),
                      "free on " + device + " (cudaMemGetInfo)"};
  } catch (const std::exception&) {
    return std::nullopt;
  }
#else
  return std::nullopt;
#endif
}

MemoryEstimate estimate_memory(const ModelConfig& config, const std::string& dtype,
                               const Workload& workload) {
  const TextConfig& t = config.text;
  const std::uint64_t e = dtype == "fp32" || dtype == "float32" ? 4 : 2;
  const std::uint64_t rows = u(std::max<std::int64_t>(workload.rows, 1));
  const std::uint64_t batch = u(std::max<std::int64_t>(workload.max_batch, 1));
  const std::uint64_t c = u(std::max<std::int64_t>(config.canvas_length, 1));
  const std::uint64_t v = u(t.vocab_size);
  const std::uint64_t prompt =
      u(workload.prompt_tokens > 0 ? workload.prompt_tokens : kDefaultPromptTokens);
  const std::uint64_t new_tokens = u(workload.new_tokens > 0 ? workload.new_tokens : 1);
  const std::uint64_t sequence = prompt + (new_tokens + c - 1) / c * c;

  MemoryEstimate m;
  m.rows = static_cast<std::int64_t>(rows);
  m.sequence = static_cast<std::int64_t>(sequence);
  m.dtype = e == 4 ? "fp32" : "bf16";
  std::uint64_t largest = 0;
  for (const auto& spec : weight_specs(t)) {
    std::uint64_t n = 1;
    for (const auto d : spec.shape) {
      n *= u(d);
    }
    m.weights += n * e;
    largest = std::max(largest, n);
  }
  // random_weights draws each tensor in fp32 before the cast; a checkpoint tensor is converted
  // from its mapped bytes one at a time.
  m.loading = largest * 4;

  // Encoder K and V per row: full layers keep every position, sliding layers their window, each
  // with room for a canvas after them (KvRoom).
  std::uint64_t kv_per_row = 0;
  std::uint64_t max_head_dim = 0;
  for (std::int64_t l = 0; l < t.num_hidden_layers; ++l) {
    const std::uint64_t kept =
        (t.is_sliding(l) ? std::min(sequence, u(t.sliding_window)) : sequence) + c;
    kv_per_row += 2 * u(t.layer_kv_heads(l)) * u(t.layer_head_dim(l)) * kept * e;
    max_head_dim = std::max(max_head_dim, u(t.layer_head_dim(l)));
  }
  m.kv_cache = rows * kv_per_row;

  // Self-conditioning logits of every row (model dtype) + one step's fp32 temporaries and the
  // lm_head output of the largest batch.
  m.logits = rows * c * v * e + batch * c * v * (kStepLogitCopies * 4 + e);

  // One layer at a time: hidden-size and MLP/expert intermediates of the largest batch's canvas
  // (or the prompt, at prefill), plus math attention's fp32 scores, softmax and K/V copies.
  const std::uint64_t tokens = batch * std::max(c, prompt);
  const std::uint64_t h = u(t.hidden_size);
  const std::uint64_t hq = u(t.num_attention_heads);
  const std::uint64_t per_token = 12 * h + 3 * u(t.intermediate_size) +
                                  3 * u(t.top_k_experts) * 2 * u(t.moe_intermediate_size) +
                                  4 * hq * max_head_dim + 2 * u(t.num_experts);
  const std::uint64_t queries = std::max(c, prompt);
  m.activations = tokens * per_token * 4 +
                  batch * hq * (2 * queries * sequence + 2 * sequence * max_head_dim) * 4;
  m.runtime = 256 * kMiB;
  return m;
}

base::Result<void> check_memory(const MemoryEstimate& estimate, const std::string& what,
                                const std::string& device, const FreeMemoryFn& free_memory) {
  return base::guarded([&]() -> base::Result<void> {
    const std::optional<FreeMemory> free =
        free_memory ? free_memory(device) : query_free_memory(device);
    if (!free || estimate.total() <= free->bytes) {
      return base::ok_result();
    }
    return base::Error{base::ErrorCode::OutOfMemory,
                       "not enough memory for " + what + " on " + device + ": it needs " +
                           estimate.describe() + ", but only " + gib(free->bytes) + " is free (" +
                           free->source +
                           "). Use a smaller preset, fewer or smaller batches, bf16 instead of "
                           "fp32, or a machine with more memory."};
  });
}

base::Result<std::shared_ptr<const DiffusionGemma>> load_model(const ModelSource& source,
                                                               const LoadOptions& options) {
  return base::guarded([&]() -> std::shared_ptr<const DiffusionGemma> {
    if (source.preset.empty() == source.checkpoint_dir.empty()) {
      base::raise(base::ErrorCode::InvalidArgument,
                  "give either a preset or a checkpoint directory");
    }
    const at::Device device = parse_device(options.device);
    const at::ScalarType dtype = parse_dtype(options.dtype, device);
    const RunSettings settings{parse_experts(options.experts), options.switches};
    kernels::set_invariant_plan(options.switches.bi_plan);
    // Refused up front when it cannot fit, before anything large is allocated.
    const auto check = [&](const ModelConfig& config) {
      const MemoryEstimate estimate =
          estimate_memory(config, dtype == at::kFloat ? "fp32" : "bf16", options.workload);
      if (auto fits =
              check_memory(estimate, source.describe(), options.device, options.free_memory);
          !fits.ok()) {
        throw base::ErrorException(fits.error());
      }
    };
    if (!source.preset.empty()) {
      auto config = load_preset(source.preset);
      if (!config.ok()) {
        throw base::ErrorException(config.error());
      }
      check(config.value());
      const PresetBundle bundle = preset_bundle(source.preset);
      ModelWeights weights =
          bundle.trained()
              ? load_weights(Checkpoint::from_memory("preset " + source.preset + " (bundled)",
                                                     bundle.weights.data(), bundle.weights.size()),
                             config.value(), device, dtype, options.progress, options.cancel)
              : random_weights(config.value(), source.seed, device, dtype);
      return std::make_shared<const DiffusionGemma>(std::move(config).value(), std::move(weights),
                                                    settings);
    }
    auto config = load_config_file(source.checkpoint_dir / "config.json");
    if (!config.ok()) {
      throw base::ErrorException(config.error());
    }
    check(config.value());
    const Checkpoint checkpoint = Checkpoint::open(source.checkpoint_dir);
    ModelWeights weights =
        load_weights(checkpoint, config.value(), device, dtype, options.progress, options.cancel);
    return std::make_shared<const DiffusionGemma>(std::move(config).value(), std::move(weights),
                                                  settings);
  });
}

}  // namespace batchlens::model
