// SPDX-License-Identifier: Apache-2.0
// Routing: where row 0's tokens are sent to a different expert set than in the reference, and
// how close the reference's router was to a tie there.
#include <algorithm>
#include <cmath>
#include <limits>

#include <QGridLayout>
#include <QLabel>
#include <QVBoxLayout>

#include "ui/heatmap_plot.h"
#include "ui/report_render.h"
#include "ui/views.h"

namespace batchlens::ui {

namespace {

bool hasRouting(const experiment::ComparisonResult& c) {
  return c.routing_flips.shape.size() == 3 && c.router_margin.shape.size() == 3;
}

bool comparedAt(const experiment::ComparisonResult& c, int tick) {
  const auto* flag = elementAt(c.compared, tick);
  return flag != nullptr && *flag != 0;
}

// Whether the expert set of `position` differs at (tick, layer); false outside the arrays.
bool flipped(const experiment::ComparisonResult& c, int tick, int layer, std::int64_t position) {
  const auto* flip = elementAt(c.routing_flips, {tick, layer, position});
  return flip != nullptr && *flip != 0;
}

// The reference's router margin at (tick, layer, position), NaN outside the array.
double margin(const experiment::ComparisonResult& c, int tick, int layer, std::int64_t position) {
  const auto* m = elementAt(c.router_margin, {tick, layer, position});
  return m == nullptr ? std::numeric_limits<double>::quiet_NaN() : *m;
}

// Positions whose expert set differs at (tick, layer), NaN where not compared.
double flipCount(const experiment::ComparisonResult& c, int tick, int layer) {
  if (!hasRouting(c) || !comparedAt(c, tick) || layer < 0 || layer >= c.routing_flips.shape[1]) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  double n = 0;
  for (std::int64_t p = 0; p < c.routing_flips.shape[2]; ++p) {
    n += flipped(c, tick, layer, p) ? 1 : 0;
  }
  return n;
}

// The smallest reference margin among the flipped positions at (tick, layer), or NaN.
double minFlippedMargin(const experiment::ComparisonResult& c, int tick, int layer) {
  double best = std::numeric_limits<double>::quiet_NaN();
  if (!hasRouting(c) || !comparedAt(c, tick) || layer < 0 || layer >= c.routing_flips.shape[1]) {
    return best;
  }
  for (std::int64_t p = 0; p < c.routing_flips.shape[2]; ++p) {
    const double m = margin(c, tick, layer, p);
    if (flipped(c, tick, layer, p) && !std::isnan(m)) {
      best = std::isnan(best) ? m : std::min(best, m);
    }
  }
  return best;
}

void setupDetail(QCustomPlot* p) {
  // Its axes and legend alone would ask for 455 px; two side by side must fit a 1024-px window.
  p->setMinimumSize(240, 160);
  auto* bars = new QCPBars(p->xAxis, p->yAxis);
  bars->setName(QObject::tr("expert set differs"));
  bars->setBrush(QColor(0xd7, 0x30, 0x27, 160));
  bars->setPen(Qt::NoPen);
  bars->setWidth(1.0);
  p->addGraph(p->xAxis, p->yAxis2);
  p->graph(0)->setName(QObject::tr("reference router margin (k-th − (k+1)-th score)"));
  p->graph(0)->setPen(QPen(QColor(0x31, 0x68, 0xb0), 1.5));
  p->yAxis2->setVisible(true);
  p->yAxis->setRange(0, 1.05);
  p->yAxis->setLabel(QObject::tr("flip"));
  p->yAxis2->setLabel(QObject::tr("margin"));
  p->xAxis->setLabel(QObject::tr("canvas position"));
  p->legend->setVisible(true);
  p->legend->setFont(QFont(p->font().family(), 8));
  p->plotLayout()->insertRow(0);
  p->plotLayout()->addElement(0, 0, new QCPTextElement(p, QString()));
  // The legend below the chart, in a row of its own: never over the bars.
  p->axisRect()->insetLayout()->take(p->legend);
  p->plotLayout()->addElement(2, 0, p->legend);
  p->legend->setFillOrder(QCPLayoutGrid::foColumnsFirst);
  p->legend->setBorderPen(Qt::NoPen);
  p->plotLayout()->setRowStretchFactor(2, 0.001);
}

}  // namespace

RoutingView::RoutingView(ExplorerState* state, QWidget* parent) : CoalescedView(state, parent) {
  caption_ = new QLabel(this);
  caption_->setWordWrap(true);
  before_ = new HeatmapPlot(this);
  before_->setObjectName(QStringLiteral("RoutingBefore"));
  after_ = new HeatmapPlot(this);
  after_->setObjectName(QStringLiteral("RoutingAfter"));
  detail_before_ = new QCustomPlot(this);
  detail_before_->setObjectName(QStringLiteral("RoutingDetailBefore"));
  detail_after_ = new QCustomPlot(this);
  detail_after_->setObjectName(QStringLiteral("RoutingDetailAfter"));
  setupDetail(detail_before_);
  setupDetail(detail_after_);
  auto* grid = new QGridLayout;
  grid->addWidget(before_, 0, 0);
  grid->addWidget(after_, 0, 1);
  grid->addWidget(detail_before_, 1, 0);
  grid->addWidget(detail_after_, 1, 1);
  grid->setRowStretch(0, 3);
  grid->setRowStretch(1, 2);
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(caption_);
  layout->addLayout(grid, 1);

  for (HeatmapPlot* plot : {before_, after_}) {
    connect(plot, &HeatmapPlot::cellClicked, this,
            [this](int column, int row) { state_->setCell(column, row); });
    plot->setTooltipText([this, plot](int column, int row, double value) {
      const auto* c = state_->comparison(plot == before_ ? Side::Before : Side::After);
      if (c == nullptr) {
        return QString();
      }
      return tr("layer %1 · %2\n%3 of %4 positions route to a different expert set\n"
                "smallest reference margin among them: %5")
          .arg(row)
          .arg(state_->tickLabel(column))
          .arg(formatValue(value))
          .arg(state_->canvasLength())
          .arg(formatValue(minFlippedMargin(*c, column, row)));
    });
  }
}

int RoutingView::detailLayer() const {
  const auto* c = state_->comparison(Side::Before);
  if (c == nullptr || !hasRouting(*c)) {
    return -1;
  }
  const int layers = static_cast<int>(c->routing_flips.shape[1]);
  const int slot = state_->layerSlot();
  if (slot >= 0 && slot < layers) {
    return slot;
  }
  // A per-step tap is selected: the layer with the most flips at this step, on both sides.
  int layer = -1;
  double most = -1;
  for (int l = 0; l < layers; ++l) {
    const double n = flipCount(*c, state_->tick(), l);
    if (!std::isnan(n) && n > most) {
      most = n;
      layer = l;
    }
  }
  return layer;
}

QString RoutingView::detailTitle(Side side) const {
  QCustomPlot* p = detail(side);
  auto* title = qobject_cast<QCPTextElement*>(p->plotLayout()->element(0, 0));
  return title == nullptr ? QString() : title->text();
}

void RoutingView::fill(HeatmapPlot* plot, QCustomPlot* detail,
                       const experiment::ComparisonResult* c, int layer) {
  const bool on = c != nullptr && hasRouting(*c);
  plot->setVisible(c != nullptr);
  detail->setVisible(c != nullptr);
  if (!on) {
    plot->setGrid(0, 0, {}, false);
    plot->setTitle(c == nullptr ? QString() : tr("no routing recorded (no MoE taps)"));
    return;
  }
  const int ticks = state_->ticks();
  const int layers = static_cast<int>(c->routing_flips.shape[1]);
  std::vector<double> values(static_cast<std::size_t>(ticks) * static_cast<std::size_t>(layers));
  for (int l = 0; l < layers; ++l) {
    for (int t = 0; t < ticks; ++t) {
      values[static_cast<std::size_t>(l) * static_cast<std::size_t>(ticks) +
             static_cast<std::size_t>(t)] = flipCount(*c, t, l);
    }
  }
  // Both sides on one absolute scale: 1 .. every position of the canvas.
  ValueRange range;
  range.min_positive = 1;
  range.max = std::max(1, state_->canvasLength());
  plot->setGrid(ticks, layers, std::move(values), state_->logScale(), &range);
  setStepAxis(plot->xAxis, *state_);
  plot->setAxisLabels(tr("denoising step (canvas 1 unless marked)"), tr("layer"),
                      tr("positions flipped"));
  plot->setTitle(comparisonLabel(*state_->result(), *c));
  layer = layer >= layers ? -1 : layer;
  plot->setSelectedCell(state_->tick(), layer);

  QVector<double> xs;
  QVector<double> flips;
  QVector<double> margins;
  const int tick = state_->tick();
  if (layer >= 0 && comparedAt(*c, tick)) {
    for (std::int64_t p = 0; p < c->routing_flips.shape[2]; ++p) {
      xs << static_cast<double>(p);
      flips << (flipped(*c, tick, layer, p) ? 1.0 : 0.0);
      margins << margin(*c, tick, layer, p);
    }
  }
  auto* bars = qobject_cast<QCPBars*>(detail->plottable(0));
  if (bars != nullptr) {
    bars->setData(xs, flips);
  }
  detail->graph(0)->setData(xs, margins);
  detail->xAxis->setRange(-0.5, std::max(state_->canvasLength(), 1) - 0.5);
  detail->yAxis2->rescale();
  auto* title = qobject_cast<QCPTextElement*>(detail->plotLayout()->element(0, 0));
  if (title != nullptr) {
    title->setText(layer < 0
                       ? tr("no step compared here: select a cell above")
                       : tr("layer %1%2 · %3 · per position")
                             .arg(layer)
                             .arg(layer == state_->layerSlot() ? QString() : tr(" (most flips)"))
                             .arg(state_->tickLabel(tick)));
  }
  detail->replot(QCustomPlot::rpQueuedReplot);
}

void RoutingView::refresh() {
  if (state_->result() == nullptr) {
    return;
  }
  caption_->setText(
      tr("Expert-set flips of row 0 against the reference, per layer and step. Below: the "
         "selected cell per position, with the reference's router margin; a flip at a tiny "
         "margin is a near-tie tipped by rounding."));
  // Both per-position charts show one layer: the before side's choice.
  const int layer = detailLayer();
  fill(before_, detail_before_, state_->comparison(Side::Before), layer);
  fill(after_, detail_after_, state_->comparison(Side::After), layer);
}

QPixmap RoutingView::renderReport(const QSize& size) {
  flush();
  std::vector<PlotColumn> columns;
  columns.push_back({tr("before (as run)"), {before_, detail_before_}, {3, 2}});
  if (state_->hasAfter()) {
    columns.push_back({tr("after (row-wise workaround)"), {after_, detail_after_}, {3, 2}});
  }
  return composePlots(size, tr("Routing: expert-set flips and router margins"), columns);
}

}  // namespace batchlens::ui
