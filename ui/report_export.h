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

class SweepView;

class CoalescedView;

/// A view and the file stem of its page ("layer_step").
using ReportView = std::pair<QString, CoalescedView*>;

/// Writes the report into the folder `dir`: `<stem>.png` (kReportWidth × kReportHeight) for each
/// view, `summary.md` and `summary.json`. The folder is built beside `dir` and moved into place
/// when complete, so `dir` afterwards holds the whole report or does not exist (an error, a
/// crash, SIGINT/SIGTERM). `dir` must not exist or be an empty folder (checkReportFolder); its
/// parent is created when missing. Texts that are not valid UTF-8 (a run's text, a prompt) are
/// written with U+FFFD in their place. Returns the paths written. Errors: InvalidArgument (no
/// experiment, `dir` not empty), FileCorrupted (arrays that do not fit their shapes), IoFailed
/// (with the system's reason). Never throws. GUI thread only.
base::Result<QStringList> exportReport(const QString& dir, const ExplorerState& state,
                                       const std::vector<ReportView>& views);

/// Writes a sweep's report into the folder `dir`, as exportReport does for an experiment:
/// `sweep.png` (the Sweep view as a report page), `summary.md` (batchlens-cli summary's text)
/// and `summary.json` (its --json). Same folder rules, atomicity and errors. GUI thread only.
base::Result<QStringList> exportSweepReport(const QString& dir, SweepView& view);

/// Whether `dir` can receive a report: it does not exist, or is an empty folder. Errors:
/// InvalidArgument naming `dir` and what is in the way.
base::Result<void> checkReportFolder(const QString& dir);

/// A folder that does not exist yet inside `parent` for a report of the state's comparison:
/// `batchlens-report-<comparison>-<yyyyMMdd-HHmmss>`, with `-2`, `-3`, ... when taken.
QString newReportFolder(const QString& parent, const ExplorerState& state);

/// The Markdown summary of the state's experiment with its selected comparison first.
QString reportMarkdown(const ExplorerState& state, const QStringList& images);

}  // namespace batchlens::ui
