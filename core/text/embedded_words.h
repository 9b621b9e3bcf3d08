// SPDX-License-Identifier: Apache-2.0
// The word list embedded in the binary, from which the generated demo tokenizer takes its
// vocabulary. Internal to core/text.
#pragma once

#include <string_view>

namespace batchlens::text::detail {

/// resources/text/words.txt, one lowercase word per line, embedded verbatim. Defined in a
/// source file that CMake generates at configure time (core/CMakeLists.txt).
std::string_view embedded_words();

}  // namespace batchlens::text::detail
