// SPDX-License-Identifier: Apache-2.0
// Export report: a folder with a PNG of every view for the current comparison and a summary
// (Markdown and JSON) a maintainer can read without BatchLens.
#pragma once

#include <utility>
#include <vector>

#include <QString>
#include <QStringList>

#include "core/base/error.h"
#include "ui/explorer_state.h"

namespace batchlens::ui {

class CoalescedView;

/// A view and the file stem of its page ("layer_step").
using ReportView = std::pair<QString, CoalescedView*>;

/// Creates `dir` if needed and writes `<stem>.png` (kReportWidth × kReportHeight) for each view,
/// `summary.md` and `summary.json`, each through a temporary file renamed into place. Returns
/// the paths written. Errors: InvalidArgument (no experiment), IoFailed. GUI thread only.
base::Result<QStringList> exportReport(const QString& dir, const ExplorerState& state,
                                       const std::vector<ReportView>& views);

/// The Markdown summary of the state's experiment with its selected comparison first.
QString reportMarkdown(const ExplorerState& state, const QStringList& images);

}  // namespace batchlens::ui
