// SPDX-License-Identifier: Apache-2.0
#include "ui/heatmap_plot.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <QToolTip>

namespace batchlens::ui {

namespace {

// White for "identical", then yellow to dark red: differences stand out, zero stays quiet.
QCPColorGradient divergenceGradient() {
  QCPColorGradient g;
  g.clearColorStops();
  g.setColorStopAt(0.0, QColor(0xff, 0xff, 0xff));
  g.setColorStopAt(1e-6, QColor(0xff, 0xf5, 0xc0));
  g.setColorStopAt(0.35, QColor(0xfd, 0xae, 0x61));
  g.setColorStopAt(0.7, QColor(0xd7, 0x30, 0x27));
  g.setColorStopAt(1.0, QColor(0x67, 0x00, 0x0d));
  g.setNanHandling(QCPColorGradient::nhNanColor);
  g.setNanColor(QColor(0xd9, 0xd9, 0xd9));
  return g;
}

}  // namespace

QString formatValue(double value) {
  if (std::isnan(value)) {
    return QObject::tr("not compared");
  }
  if (value == 0) {
    return QStringLiteral("0");
  }
  return QString::number(value, 'g', 6);
}

HeatmapPlot::HeatmapPlot(QWidget* parent) : QCustomPlot(parent) {
  setMinimumSize(320, 220);
  setMouseTracking(true);
  plotLayout()->insertRow(0);
  title_ = new QCPTextElement(this, QString(), QFont(font().family(), 10, QFont::Bold));
  plotLayout()->addElement(0, 0, title_);

  map_ = new QCPColorMap(xAxis, yAxis);
  scale_ = new QCPColorScale(this);
  plotLayout()->addElement(1, 1, scale_);
  scale_->setType(QCPAxis::atRight);
  map_->setColorScale(scale_);
  map_->setGradient(divergenceGradient());
  map_->setInterpolate(false);
  map_->setTightBoundary(false);  // cells centred on integer coordinates
  // Integer ticks only: cells are layers, steps and positions.
  for (QCPAxis* axis : {xAxis, yAxis}) {
    auto ticker = QSharedPointer<QCPAxisTickerFixed>::create();
    ticker->setTickStep(1.0);
    ticker->setScaleStrategy(QCPAxisTickerFixed::ssMultiples);
    axis->setTicker(ticker);
  }

  auto* group = new QCPMarginGroup(this);
  axisRect()->setMarginGroup(QCP::msBottom | QCP::msTop, group);
  scale_->setMarginGroup(QCP::msBottom | QCP::msTop, group);

  mark_ = new QCPItemRect(this);
  mark_->setPen(QPen(Qt::black, 2));
  mark_->setBrush(Qt::NoBrush);
  mark_->setVisible(false);
  mark_->setSelectable(false);
}

void HeatmapPlot::setGrid(int columns, int rows, std::vector<double> values, bool log_scale) {
  columns_ = std::max(columns, 0);
  rows_ = std::max(rows, 0);
  values_ = std::move(values);
  values_.resize(static_cast<std::size_t>(columns_) * static_cast<std::size_t>(rows_),
                 std::numeric_limits<double>::quiet_NaN());
  double max_value = 0;
  double min_positive = std::numeric_limits<double>::infinity();
  for (double v : values_) {
    if (!std::isnan(v)) {
      max_value = std::max(max_value, v);
      if (v > 0) {
        min_positive = std::min(min_positive, v);
      }
    }
  }
  // QCPColorMapData needs two cells per axis to know a cell's extent: pad a single row or
  // column with a NaN one outside the visible range.
  const int data_columns = std::max(columns_, 2);
  const int data_rows = std::max(rows_, 2);
  auto* data = map_->data();
  data->setSize(data_columns, data_rows);
  data->setRange(QCPRange(0, data_columns - 1), QCPRange(0, data_rows - 1));
  data->fill(std::numeric_limits<double>::quiet_NaN());
  const bool log = log_scale && std::isfinite(min_positive);
  const double floor_value = log ? min_positive / 10 : 0;
  for (int r = 0; r < rows_; ++r) {
    for (int c = 0; c < columns_; ++c) {
      double v = values_[static_cast<std::size_t>(r) * static_cast<std::size_t>(columns_) +
                         static_cast<std::size_t>(c)];
      if (log && !std::isnan(v) && v <= 0) {
        v = floor_value;
      }
      data->setCell(c, r, v);
    }
  }
  scale_->axis()->setScaleType(log ? QCPAxis::stLogarithmic : QCPAxis::stLinear);
  if (log) {
    scale_->axis()->setTicker(QSharedPointer<QCPAxisTickerLog>::create());
    map_->setDataRange(QCPRange(floor_value, std::max(max_value, floor_value * 10)));
  } else {
    scale_->axis()->setTicker(QSharedPointer<QCPAxisTicker>::create());
    map_->setDataRange(QCPRange(0, max_value > 0 ? max_value : 1));
  }
  xAxis->setRange(-0.5, std::max(columns_, 1) - 0.5);
  yAxis->setRange(-0.5, std::max(rows_, 1) - 0.5);
  replot(QCustomPlot::rpQueuedReplot);
}

void HeatmapPlot::setRowLabels(const QStringList& labels) {
  if (labels.isEmpty()) {
    auto ticker = QSharedPointer<QCPAxisTickerFixed>::create();
    ticker->setTickStep(1.0);
    ticker->setScaleStrategy(QCPAxisTickerFixed::ssMultiples);
    yAxis->setTicker(ticker);
    return;
  }
  auto ticker = QSharedPointer<QCPAxisTickerText>::create();
  for (int i = 0; i < labels.size(); ++i) {
    ticker->addTick(i, labels[i]);
  }
  yAxis->setTicker(ticker);
}

void HeatmapPlot::setTitle(const QString& title) {
  title_->setText(title);
  replot(QCustomPlot::rpQueuedReplot);
}

void HeatmapPlot::setAxisLabels(const QString& x, const QString& y, const QString& scale) {
  xAxis->setLabel(x);
  yAxis->setLabel(y);
  scale_->axis()->setLabel(scale);
}

void HeatmapPlot::setSelectedCell(int column, int row) {
  const bool on = column >= 0 && row >= 0 && column < columns_ && row < rows_;
  mark_->setVisible(on);
  if (on) {
    mark_->topLeft->setCoords(column - 0.5, row + 0.5);
    mark_->bottomRight->setCoords(column + 0.5, row - 0.5);
  }
  replot(QCustomPlot::rpQueuedReplot);
}

void HeatmapPlot::setTooltipText(std::function<QString(int, int, double)> text) {
  tooltip_ = std::move(text);
}

double HeatmapPlot::value(int column, int row) const {
  if (column < 0 || row < 0 || column >= columns_ || row >= rows_) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  return values_[static_cast<std::size_t>(row) * static_cast<std::size_t>(columns_) +
                 static_cast<std::size_t>(column)];
}

bool HeatmapPlot::cellAt(const QPoint& pos, int* column, int* row) const {
  if (columns_ == 0 || rows_ == 0 || !axisRect()->rect().contains(pos)) {
    return false;
  }
  const int c = static_cast<int>(std::lround(xAxis->pixelToCoord(pos.x())));
  const int r = static_cast<int>(std::lround(yAxis->pixelToCoord(pos.y())));
  if (c < 0 || r < 0 || c >= columns_ || r >= rows_) {
    return false;
  }
  *column = c;
  *row = r;
  return true;
}

QString HeatmapPlot::tooltipFor(int column, int row) const {
  const double v = value(column, row);
  if (tooltip_) {
    return tooltip_(column, row, v);
  }
  return QStringLiteral("(%1, %2): %3").arg(column).arg(row).arg(formatValue(v));
}

QPixmap HeatmapPlot::render(const QSize& size) {
  return toPixmap(size.width(), size.height());
}

void HeatmapPlot::mouseMoveEvent(QMouseEvent* event) {
  QCustomPlot::mouseMoveEvent(event);
  int c = 0;
  int r = 0;
  if (cellAt(event->pos(), &c, &r)) {
    QToolTip::showText(event->globalPosition().toPoint(), tooltipFor(c, r), this);
  } else {
    QToolTip::hideText();
  }
}

void HeatmapPlot::mousePressEvent(QMouseEvent* event) {
  QCustomPlot::mousePressEvent(event);
  int c = 0;
  int r = 0;
  if (event->button() == Qt::LeftButton && cellAt(event->pos(), &c, &r)) {
    Q_EMIT cellClicked(c, r);
  }
}

}  // namespace batchlens::ui
