// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string_view>

namespace batchlens::text::detail {

/// resources/text/words.txt, one lowercase word per line, embedded verbatim. Defined in a
/// source file that CMake generates at configure time (core/CMakeLists.txt).
std::string_view embedded_words();

}  // namespace batchlens::text::detail
