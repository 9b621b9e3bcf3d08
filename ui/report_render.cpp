// SPDX-License-Identifier: Apache-2.0
#include "ui/report_render.h"

#include <algorithm>
#include <numeric>

#include <QPainter>
#include <QTextDocument>

#include "ui/qcp.h"

namespace batchlens::ui {

namespace {

constexpr int kMargin = 16;
constexpr int kHeading = 40;
constexpr int kCaption = 26;

// Fills the page white and draws the heading; returns the area below it.
QRect startPage(QPainter& painter, const QSize& size, const QString& heading) {
  painter.fillRect(QRect(QPoint(0, 0), size), Qt::white);
  QFont font = painter.font();
  font.setPointSize(14);
  font.setBold(true);
  painter.setFont(font);
  painter.setPen(Qt::black);
  painter.drawText(QRect(kMargin, 0, size.width() - 2 * kMargin, kHeading),
                   Qt::AlignVCenter | Qt::AlignLeft, heading);
  font.setPointSize(10);
  font.setBold(false);
  painter.setFont(font);
  return {kMargin, kHeading, size.width() - 2 * kMargin, size.height() - kHeading - kMargin};
}

QRect columnRect(const QRect& area, int index, int count) {
  const int width = (area.width() - (count - 1) * kMargin) / std::max(count, 1);
  return {area.left() + index * (width + kMargin), area.top(), width, area.height()};
}

}  // namespace

QSize reportSize() {
  return {kReportWidth, kReportHeight};
}

QPixmap composePlots(const QSize& size, const QString& heading,
                     const std::vector<PlotColumn>& columns) {
  QPixmap page(size);
  QPainter painter(&page);
  const QRect area = startPage(painter, size, heading);
  const int count = static_cast<int>(columns.size());
  for (int i = 0; i < count; ++i) {
    const PlotColumn& col = columns[static_cast<std::size_t>(i)];
    const QRect rect = columnRect(area, i, count);
    painter.drawText(QRect(rect.left(), rect.top(), rect.width(), kCaption),
                     Qt::AlignVCenter | Qt::AlignLeft, col.caption);
    const int n = static_cast<int>(col.plots.size());
    std::vector<int> stretch = col.stretch;
    stretch.resize(static_cast<std::size_t>(n), 1);
    const int total = std::max(1, std::accumulate(stretch.begin(), stretch.end(), 0));
    const int height = rect.height() - kCaption;
    int y = rect.top() + kCaption;
    for (int p = 0; p < n; ++p) {
      const int h = height * stretch[static_cast<std::size_t>(p)] / total;
      QCustomPlot* plot = col.plots[static_cast<std::size_t>(p)];
      if (plot != nullptr && h > 0) {
        painter.drawPixmap(rect.left(), y, plot->toPixmap(rect.width(), h));
      }
      y += h;
    }
  }
  return page;
}

QPixmap composeDocuments(const QSize& size, const QString& heading, const QStringList& captions,
                         const QStringList& html, const std::vector<int>& weights) {
  QPixmap page(size);
  QPainter painter(&page);
  const QRect area = startPage(painter, size, heading);
  const int count = static_cast<int>(html.size());
  std::vector<int> share = weights;
  share.resize(static_cast<std::size_t>(count), 1);
  const int total = std::max(1, std::accumulate(share.begin(), share.end(), 0));
  const int usable = area.width() - (count - 1) * kMargin;
  int left = area.left();
  for (int i = 0; i < count; ++i) {
    const int width = usable * share[static_cast<std::size_t>(i)] / total;
    const QRect rect(left, area.top(), width, area.height());
    left += width + kMargin;
    if (i < captions.size()) {
      painter.drawText(QRect(rect.left(), rect.top(), rect.width(), kCaption),
                       Qt::AlignVCenter | Qt::AlignLeft, captions[i]);
    }
    QTextDocument doc;
    doc.setDefaultFont(painter.font());
    // Lines break between words only: a narrow table column never splits one ("Compa rison").
    QTextOption option = doc.defaultTextOption();
    option.setWrapMode(QTextOption::WordWrap);
    doc.setDefaultTextOption(option);
    doc.setHtml(html[i]);
    doc.setTextWidth(rect.width());
    painter.save();
    painter.translate(rect.left(), rect.top() + kCaption);
    doc.drawContents(&painter, QRectF(0, 0, rect.width(), rect.height() - kCaption));
    painter.restore();
  }
  return page;
}

}  // namespace batchlens::ui
