// SPDX-License-Identifier: Apache-2.0
// Enumerations stored and typed by name ("per_row", "lockstep", ...): one parser for all of them.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

#include "core/base/error.h"

namespace batchlens::base {

/// The value among `values` whose name(value) is `text`; otherwise InvalidArgument
/// "WHAT 'TEXT': expected a, b or c". Never throws.
template <class T>
Result<T> parse_named(std::string_view text, std::initializer_list<T> values,
                      const char* (*name)(T), const char* what) {
  std::string expected;
  std::size_t i = 0;
  for (const T value : values) {
    if (text == name(value)) {
      return value;
    }
    expected += std::string(i == 0 ? "" : (i + 1 == values.size() ? " or " : ", ")) + name(value);
    ++i;
  }
  return Error{ErrorCode::InvalidArgument,
               std::string(what) + " '" + std::string(text) + "': expected " + expected};
}

}  // namespace batchlens::base
