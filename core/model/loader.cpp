// SPDX-License-Identifier: Apache-2.0
#include "core/model/loader.h"

#include <fstream>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include "core/base/atomic_file.h"
#include "core/model/diffusion_gemma.h"
#include "core/model/safetensors.h"
#include "core/model/weights.h"
#include "core/sampling/generation_config.h"
#include "core/text/tokenizer_builder.h"

namespace batchlens::model {

std::string ModelSource::describe() const {
  if (!preset.empty()) {
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

base::Result<std::shared_ptr<const DiffusionGemma>> load_model(const ModelSource& source,
                                                               const LoadOptions& options) {
  return base::guarded([&]() -> std::shared_ptr<const DiffusionGemma> {
    if (source.preset.empty() == source.checkpoint_dir.empty()) {
      base::raise(base::ErrorCode::InvalidArgument,
                  "give either a preset or a checkpoint directory");
    }
    const at::Device device = parse_device(options.device);
    const at::ScalarType dtype = parse_dtype(options.dtype, device);
    const RunSettings settings{parse_experts(options.experts)};
    if (!source.preset.empty()) {
      auto config = load_preset(source.preset);
      if (!config.ok()) {
        throw base::ErrorException(config.error());
      }
      ModelWeights weights = random_weights(config.value(), source.seed, device, dtype);
      return std::make_shared<const DiffusionGemma>(std::move(config).value(), std::move(weights),
                                                    settings);
    }
    auto config = load_config_file(source.checkpoint_dir / "config.json");
    if (!config.ok()) {
      throw base::ErrorException(config.error());
    }
    const Checkpoint checkpoint = Checkpoint::open(source.checkpoint_dir);
    ModelWeights weights =
        load_weights(checkpoint, config.value(), device, dtype, options.progress, options.cancel);
    return std::make_shared<const DiffusionGemma>(std::move(config).value(), std::move(weights),
                                                  settings);
  });
}

base::Result<void> save_random_model(const std::string& preset, std::uint64_t seed,
                                     const std::filesystem::path& dir,
                                     std::uint64_t max_shard_bytes) {
  return base::guarded([&] {
    auto config = load_preset(preset);
    if (!config.ok()) {
      throw base::ErrorException(config.error());
    }
    const ModelWeights weights = random_weights(config.value(), seed, at::kCPU, at::kBFloat16);
    std::filesystem::create_directories(dir);
    write_checkpoint(
        dir, named_tensors(weights, config.value().text), max_shard_bytes,
        {{"format", "pt"}, {"batchlens_preset", preset}, {"batchlens_seed", std::to_string(seed)}});
    // The project's tokenizer and the released generation defaults, so that the directory is
    // complete for the reference too; config.json last: a directory with one is complete.
    auto tokenizer = text::preset_tokenizer_json(config.value().text.vocab_size);
    if (!tokenizer.ok()) {
      throw base::ErrorException(tokenizer.error());
    }
    for (const auto& [name, content] :
         {std::pair<const char*, std::string>{"tokenizer.json", tokenizer.value()},
          {"generation_config.json", sampling::to_json(sampling::GenerationConfig{})},
          {"config.json", to_json(config.value()).dump(2) + "\n"}}) {
      if (auto w = base::write_file_atomic(dir / name, content); !w.ok()) {
        throw base::ErrorException(w.error());
      }
    }
  });
}

}  // namespace batchlens::model
