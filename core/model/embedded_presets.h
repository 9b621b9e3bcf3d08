// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string_view>
#include <vector>

namespace batchlens::model::detail {

/// One model preset embedded in the binary: resources/models/<name>.json, verbatim.
struct EmbeddedPreset {
  std::string_view name;
  std::string_view json;
};

/// The embedded presets in size order. Defined in a source file that CMake generates at
/// configure time from resources/models/*.json (core/CMakeLists.txt). Thread-safe; the views
/// point at static storage.
std::vector<EmbeddedPreset> embedded_presets();

}  // namespace batchlens::model::detail
