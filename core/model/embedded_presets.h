// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string_view>
#include <vector>

namespace batchlens::model::detail {

/// One model preset embedded in the binary: resources/models/<name>.json verbatim (a config:
/// seeded random weights), or the files of a trained checkpoint resources/models/<name>/.
struct EmbeddedPreset {
  std::string_view name;
  std::string_view json;                    ///< config.json
  std::string_view weights;                 ///< model.safetensors; empty: random weights
  std::string_view tokenizer_json;          ///< empty: generated from the vocabulary size
  std::string_view generation_config_json;  ///< empty: the released defaults
};

/// The embedded presets in size order. Defined in a source file that CMake generates at
/// configure time from resources/models/*.json (core/CMakeLists.txt). Thread-safe; the views
/// point at static storage.
std::vector<EmbeddedPreset> embedded_presets();

}  // namespace batchlens::model::detail
