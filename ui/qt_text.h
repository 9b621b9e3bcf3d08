// SPDX-License-Identifier: Apache-2.0
// Text from core (UTF-8 std::string) as Qt shows it: the one conversion every view uses.
#pragma once

#include <string_view>

#include <QString>

namespace batchlens::ui {

/// `s` (UTF-8) as a QString.
inline QString q(std::string_view s) {
  return QString::fromUtf8(s.data(), static_cast<qsizetype>(s.size()));
}

}  // namespace batchlens::ui
