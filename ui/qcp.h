// SPDX-License-Identifier: Apache-2.0
// The only way ui code includes QCustomPlot. batchlens_ui builds with QT_NO_KEYWORDS (Qt's
// `slots` macro breaks LibTorch headers), but qcustomplot.h 2.1 itself uses `signals:`,
// `slots` and `foreach`; define them for its header only.
#pragma once

#define signals Q_SIGNALS
#define slots Q_SLOTS
#define foreach Q_FOREACH
#include <qcustomplot.h>
#undef signals
#undef slots
#undef foreach
