// SPDX-License-Identifier: Apache-2.0
// Renders views into fixed-size report pages (PNG), independent of the window's size.
#pragma once

#include <vector>

#include <QPixmap>
#include <QSize>
#include <QString>
#include <QStringList>

class QCustomPlot;

namespace batchlens::ui {

/// The size of every page of an exported report.
inline constexpr int kReportWidth = 1600;
inline constexpr int kReportHeight = 1000;
QSize reportSize();

/// One column of a page: plots stacked top to bottom with relative heights (`stretch`, one per
/// plot; empty = equal) under a caption.
struct PlotColumn {
  QString caption;
  std::vector<QCustomPlot*> plots;
  std::vector<int> stretch;
};

/// A page with a heading and the columns side by side. Plots are re-rendered at their slot's
/// size. GUI thread only.
QPixmap composePlots(const QSize& size, const QString& heading,
                     const std::vector<PlotColumn>& columns);

/// A page with a heading and HTML documents side by side (each under its caption), as wide as
/// `weights` share them out (equal where it has no entry); lines break between words only.
QPixmap composeDocuments(const QSize& size, const QString& heading, const QStringList& captions,
                         const QStringList& html, const std::vector<int>& weights = {});

}  // namespace batchlens::ui
