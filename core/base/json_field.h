// SPDX-License-Identifier: Apache-2.0
// Typed field access for JSON records that travel between people (sweep records, provenance):
// a missing field or one of another type or range is FileCorrupted naming it, never an
// exception of the JSON library.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "core/base/error.h"

namespace batchlens::base {

/// doc[name] as T (bool, std::string, a floating-point or an integer type, checked to fit T).
/// Throws ErrorException FileCorrupted "WHERE: no field 'NAME'", "... is not a string", ...
template <class T>
T json_field(const nlohmann::json& doc, const char* name, const std::string& where) {
  const auto it = doc.find(name);
  if (it == doc.end()) {
    raise(ErrorCode::FileCorrupted, where + ": no field '" + name + "'");
  }
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) {
      raise(ErrorCode::FileCorrupted, where + ": '" + name + "' is not a boolean");
    }
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) {
      raise(ErrorCode::FileCorrupted, where + ": '" + name + "' is not a string");
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!it->is_number()) {
      raise(ErrorCode::FileCorrupted, where + ": '" + name + "' is not a number");
    }
  } else {
    if (!it->is_number_integer()) {
      raise(ErrorCode::FileCorrupted, where + ": '" + name + "' is not an integer");
    }
    if constexpr (std::is_unsigned_v<T>) {
      if (it->is_number_unsigned() || it->template get<std::int64_t>() >= 0) {
        return it->template get<T>();
      }
      raise(ErrorCode::FileCorrupted, where + ": '" + name + "' is negative");
    } else {
      const auto v = it->template get<std::int64_t>();
      if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) {
        raise(ErrorCode::FileCorrupted, where + ": '" + name + "' is out of range");
      }
      return static_cast<T>(v);
    }
  }
  return it->template get<T>();
}

}  // namespace batchlens::base
