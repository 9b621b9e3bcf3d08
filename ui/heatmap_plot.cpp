// SPDX-License-Identifier: Apache-2.0
#include "ui/heatmap_plot.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>

#include <QKeyEvent>
#include <QToolTip>

#include "ui/app_filter.h"

namespace batchlens::ui {

namespace {

// Levels of the gradient: enough that the first non-white level sits close to white's.
constexpr int kLevels = 1000;
// Where the colour part of the gradient starts; below it, white (value 0).
constexpr double kColourStart = 0.004;
// Where the smallest positive value is placed: past kColourStart by a few levels.
constexpr double kSmallestAt = 0.008;

// White for "identical" (0), then viridis (colour-blind safe, monotone in lightness) from its
// dark end: the smallest difference is dark violet against white, the largest yellow.
QCPColorGradient divergenceGradient() {
  QCPColorGradient g;
  g.clearColorStops();
  g.setLevelCount(kLevels);
  g.setColorStopAt(0.0, QColor(0xff, 0xff, 0xff));
  g.setColorStopAt(kColourStart * 0.999, QColor(0xff, 0xff, 0xff));
  const QColor viridis[] = {QColor(0x44, 0x01, 0x54), QColor(0x48, 0x28, 0x78),
                            QColor(0x3e, 0x4a, 0x89), QColor(0x31, 0x68, 0x8e),
                            QColor(0x26, 0x82, 0x8e), QColor(0x1f, 0x9e, 0x89),
                            QColor(0x35, 0xb7, 0x79), QColor(0x6e, 0xce, 0x58),
                            QColor(0xb5, 0xde, 0x2b), QColor(0xfd, 0xe7, 0x25)};
  const int n = static_cast<int>(std::size(viridis));
  for (int i = 0; i < n; ++i) {
    g.setColorStopAt(kColourStart + (1.0 - kColourStart) * i / (n - 1), viridis[i]);
  }
  g.setNanHandling(QCPColorGradient::nhNanColor);
  g.setNanColor(QColor(0xd9, 0xd9, 0xd9));
  return g;
}

// The data range whose position 0 is `floor` (value 0 is drawn there: white) and where the
// smallest positive value lands at kSmallestAt.
QCPRange colourRange(const ValueRange& range, bool log) {
  const double hi = std::max(range.max, range.min_positive);
  if (log) {
    // At least a decade below the largest value: values within a few percent of each other
    // (0.0122-0.0148, issue #34) keep nearly one colour instead of spanning the whole scale.
    const double lo = std::min(range.min_positive, hi / 10.0);
    const double span = std::log(hi / lo);
    const double below = span * kSmallestAt / (1.0 - kSmallestAt);
    return {lo / std::exp(below), hi};
  }
  if (hi <= 0) {
    return {0, 1};
  }
  // Linear: 0 at position 0; a positive value at least at kSmallestAt (values below it are
  // drawn there too, by the cells' clamp in setGrid).
  return {0, hi};
}

}  // namespace

ValueRange ValueRange::of(const std::vector<double>& values) {
  ValueRange r;
  double min_positive = std::numeric_limits<double>::infinity();
  for (double v : values) {
    if (!std::isnan(v)) {
      r.max = std::max(r.max, v);
      if (v > 0) {
        min_positive = std::min(min_positive, v);
      }
    }
  }
  r.min_positive = std::isfinite(min_positive) ? min_positive : 0;
  return r;
}

ValueRange ValueRange::united(const ValueRange& other) const {
  ValueRange r;
  r.max = std::max(max, other.max);
  if (min_positive > 0 && other.min_positive > 0) {
    r.min_positive = std::min(min_positive, other.min_positive);
  } else {
    r.min_positive = std::max(min_positive, other.min_positive);
  }
  return r;
}

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
  setMinimumSize(240, 220);  // two side by side beside the Run dock in a 1024-px window
  setMouseTracking(true);
  setFocusPolicy(Qt::StrongFocus);
  setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
  setToolTip(QString());
  plotLayout()->insertRow(0);
  title_ = new QCPTextElement(this, QString(), QFont(font().family(), 10, QFont::Bold));
  plotLayout()->addElement(0, 0, title_);

  map_ = new QCPColorMap(xAxis, yAxis);
  scale_ = new QCPColorScale(this);
  plotLayout()->addElement(1, 1, scale_);
  scale_->setType(QCPAxis::atRight);
  map_->setColorScale(scale_);
  scale_->setRangeDrag(false);  // the colour range follows the data, never the mouse
  scale_->setRangeZoom(false);
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

void HeatmapPlot::setGrid(int columns, int rows, std::vector<double> values, bool log_scale,
                          const ValueRange* range) {
  const bool same_size = columns == columns_ && rows == rows_;
  columns_ = std::max(columns, 0);
  rows_ = std::max(rows, 0);
  values_ = std::move(values);
  values_.resize(static_cast<std::size_t>(columns_) * static_cast<std::size_t>(rows_),
                 std::numeric_limits<double>::quiet_NaN());
  const ValueRange spans = range != nullptr ? *range : ValueRange::of(values_);
  // QCPColorMapData needs two cells per axis to know a cell's extent: pad a single row or
  // column with a NaN one outside the visible range.
  const int data_columns = std::max(columns_, 2);
  const int data_rows = std::max(rows_, 2);
  auto* data = map_->data();
  data->setSize(data_columns, data_rows);
  data->setRange(QCPRange(0, data_columns - 1), QCPRange(0, data_rows - 1));
  data->fill(std::numeric_limits<double>::quiet_NaN());
  const bool log = log_scale && spans.min_positive > 0;
  const QCPRange colours = colourRange(spans, log);
  // Positives below the smallest visible level are lifted to it (linear scale), zeros sit at
  // the range's floor (white).
  const double lift = log ? 0.0 : colours.lower + (colours.upper - colours.lower) * kSmallestAt;
  for (int r = 0; r < rows_; ++r) {
    for (int c = 0; c < columns_; ++c) {
      double v = values_[static_cast<std::size_t>(r) * static_cast<std::size_t>(columns_) +
                         static_cast<std::size_t>(c)];
      if (!std::isnan(v)) {
        v = v <= 0 ? colours.lower : std::max(v, lift);
      }
      data->setCell(c, r, v);
    }
  }
  scale_->axis()->setScaleType(log ? QCPAxis::stLogarithmic : QCPAxis::stLinear);
  if (log) {
    scale_->axis()->setTicker(QSharedPointer<QCPAxisTickerLog>::create());
  } else {
    scale_->axis()->setTicker(QSharedPointer<QCPAxisTicker>::create());
  }
  map_->setDataRange(colours);
  if (!same_size) {
    resetZoom();
  }
  replot(QCustomPlot::rpQueuedReplot);
}

void HeatmapPlot::resetZoom() {
  xAxis->setRange(-0.5, std::max(columns_, 1) - 0.5);
  yAxis->setRange(-0.5, std::max(rows_, 1) - 0.5);
  replot(QCustomPlot::rpQueuedReplot);
}

QColor HeatmapPlot::colorOf(double value) const {
  const QCPRange range = map_->dataRange();
  QRgb rgb = 0;
  double v = value;
  const bool log = scale_->axis()->scaleType() == QCPAxis::stLogarithmic;
  if (!std::isnan(v)) {
    // As setGrid draws it: zero at the floor, small positives lifted on the linear scale.
    const double lift = log ? 0.0 : range.lower + (range.upper - range.lower) * kSmallestAt;
    v = v <= 0 ? range.lower : std::max(v, lift);
  }
  QCPColorGradient g = map_->gradient();
  g.colorize(&v, range, &rgb, 1, 1, log);
  return QColor::fromRgba(rgb);
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

QString HeatmapPlot::title() const {
  return title_->text();
}

void HeatmapPlot::setAxisLabels(const QString& x, const QString& y, const QString& scale) {
  xAxis->setLabel(x);
  yAxis->setLabel(y);
  scale_->axis()->setLabel(scale);
}

void HeatmapPlot::setSelectedCell(int column, int row) {
  const bool on = column >= 0 && row >= 0 && column < columns_ && row < rows_;
  selected_column_ = on ? column : -1;
  selected_row_ = on ? row : -1;
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
    QToolTip::showText(event->globalPosition().toPoint(), wrappedToolTip(tooltipFor(c, r)), this);
  } else {
    QToolTip::hideText();
  }
}

void HeatmapPlot::mousePressEvent(QMouseEvent* event) {
  QCustomPlot::mousePressEvent(event);
  pressed_ = event->button() == Qt::LeftButton;
  press_pos_ = event->pos();
  setFocus(Qt::MouseFocusReason);
}

void HeatmapPlot::mouseReleaseEvent(QMouseEvent* event) {
  QCustomPlot::mouseReleaseEvent(event);
  // A click selects; a drag pans (QCustomPlot's range drag) and selects nothing.
  const bool click = pressed_ && event->button() == Qt::LeftButton &&
                     (event->pos() - press_pos_).manhattanLength() < 5;
  pressed_ = false;
  int c = 0;
  int r = 0;
  if (click && cellAt(event->pos(), &c, &r)) {
    Q_EMIT cellClicked(c, r);
  }
}

void HeatmapPlot::mouseDoubleClickEvent(QMouseEvent* event) {
  QCustomPlot::mouseDoubleClickEvent(event);
  resetZoom();
}

void HeatmapPlot::keyPressEvent(QKeyEvent* event) {
  if (columns_ == 0 || rows_ == 0) {
    QCustomPlot::keyPressEvent(event);
    return;
  }
  int c = std::max(selected_column_, 0);
  int r = std::max(selected_row_, 0);
  switch (event->key()) {
    case Qt::Key_Left:
      c = std::max(c - 1, 0);
      break;
    case Qt::Key_Right:
      c = std::min(c + 1, columns_ - 1);
      break;
    case Qt::Key_Up:  // rows grow upwards (layer 0 at the bottom)
      r = std::min(r + 1, rows_ - 1);
      break;
    case Qt::Key_Down:
      r = std::max(r - 1, 0);
      break;
    case Qt::Key_Home:
      resetZoom();
      return;
    default:
      QCustomPlot::keyPressEvent(event);
      return;
  }
  Q_EMIT cellClicked(c, r);
}

}  // namespace batchlens::ui
