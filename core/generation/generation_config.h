// SPDX-License-Identifier: Apache-2.0
// Generation settings and the generation_config.json that carries them. Torch-free.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/error.h"

namespace batchlens::generation {

/// Sampler settings; defaults are the released generation_config.json and the reference's
/// library defaults. ref: DiffusionGemmaGenerationConfig._get_default_generation_params
struct SamplerConfig {
  int max_denoising_steps = 48;
  double t_min = 0.4;
  double t_max = 0.8;
  double entropy_bound = 0.1;  ///< EntropyBoundSamplerConfig.entropy_bound
  int stability_threshold = 1;
  double confidence_threshold = 0.005;
};

/// Generation settings; defaults are the released generation_config.json (spec §1.3).
struct GenerationConfig {
  SamplerConfig sampler;
  std::int64_t max_new_tokens = 256;
  std::vector<std::int64_t> eos_token_ids{1, 106, 50};
  std::int64_t pad_token_id = 0;
};

/// Values the user set on top of generation_config.json (command line, Run panel); unset
/// fields keep the file's value.
struct GenerationOverrides {
  std::optional<int> max_denoising_steps;
  std::optional<std::int64_t> max_new_tokens;
  std::optional<double> t_min;
  std::optional<double> t_max;
  std::optional<double> entropy_bound;
  std::optional<int> stability_threshold;
  std::optional<double> confidence_threshold;
};

/// `base` with the set overrides applied, validated. Errors: InvalidArgument.
base::Result<GenerationConfig> apply(const GenerationOverrides& overrides,
                                     const GenerationConfig& base);

/// Reads a generation_config.json text over `defaults`: fields present replace the defaults,
/// unknown fields are ignored (the reference keeps them as metadata). Validates as
/// DiffusionGemmaGenerationConfig.validate does. Errors: FileCorrupted (not JSON, a field of
/// the wrong type), InvalidArgument (a value the reference refuses, e.g. t_max <= t_min).
base::Result<GenerationConfig> parse_generation_config(std::string_view json_text,
                                                       const GenerationConfig& defaults = {});

/// `dir`/generation_config.json over the defaults, or the defaults when the file is absent.
/// Errors as parse_generation_config, naming the file (nesting deeper than base::kMaxJsonDepth
/// is FileCorrupted), plus IoFailed and FileUnrecognised for a FIFO, device or directory in its
/// place (refused without blocking).
base::Result<GenerationConfig> load_generation_config(const std::filesystem::path& dir);

/// The same checks on a config built in code (e.g. from command-line overrides).
base::Result<void> validate(const GenerationConfig& config);

/// generation_config.json text in the released file's layout.
std::string to_json(const GenerationConfig& config);

}  // namespace batchlens::generation
