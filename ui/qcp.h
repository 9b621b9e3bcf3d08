// SPDX-License-Identifier: Apache-2.0
// The only way ui code includes QCustomPlot. batchlens_ui builds with QT_NO_KEYWORDS (Qt's
// `slots` macro breaks LibTorch headers), but qcustomplot.h 2.1 itself uses `signals:`,
// `slots` and `foreach`; define them for its header only.
#pragma once

#define signals Q_SIGNALS  // NOLINT(readability-identifier-naming): Qt's own keyword
#define slots Q_SLOTS      // NOLINT(readability-identifier-naming)
#define foreach Q_FOREACH  // NOLINT(readability-identifier-naming)
#include <qcustomplot.h>
#undef signals
#undef slots
#undef foreach
