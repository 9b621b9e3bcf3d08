// SPDX-License-Identifier: Apache-2.0
// Canvas spread: for the selected layer and tap, which canvas positions differ at each step,
// and the first step at which each position diverged.
#include <algorithm>
#include <cmath>

#include <QGridLayout>
#include <QLabel>
#include <QVBoxLayout>

#include "ui/heatmap_plot.h"
#include "ui/report_render.h"
#include "ui/views.h"

namespace batchlens::ui {

SpreadView::SpreadView(ExplorerState* state, QWidget* parent) : CoalescedView(state, parent) {
  caption_ = new QLabel(this);
  caption_->setObjectName(QStringLiteral("SpreadCaption"));
  caption_->setWordWrap(true);
  before_ = new HeatmapPlot(this);
  before_->setObjectName(QStringLiteral("SpreadBefore"));
  after_ = new HeatmapPlot(this);
  after_->setObjectName(QStringLiteral("SpreadAfter"));
  first_before_plot_ = new QCustomPlot(this);
  first_before_plot_->setObjectName(QStringLiteral("FirstDivergedBefore"));
  first_after_plot_ = new QCustomPlot(this);
  first_after_plot_->setObjectName(QStringLiteral("FirstDivergedAfter"));
  for (QCustomPlot* p : {first_before_plot_, first_after_plot_}) {
    p->setMinimumHeight(140);
    p->addGraph();
    p->graph(0)->setLineStyle(QCPGraph::lsNone);
    p->graph(0)->setScatterStyle(
        QCPScatterStyle(QCPScatterStyle::ssDisc, QColor(0xd7, 0x30, 0x27), 5));
    p->xAxis->setLabel(tr("canvas position"));
    p->yAxis->setLabel(tr("first diverged (tick)"));
    p->plotLayout()->insertRow(0);
    p->plotLayout()->addElement(0, 0, new QCPTextElement(p, QString()));
    auto* line = new QCPItemStraightLine(p);
    line->setPen(QPen(Qt::black, 1, Qt::DashLine));
    line->setVisible(false);
  }

  auto* grid = new QGridLayout;
  grid->addWidget(before_, 0, 0);
  grid->addWidget(after_, 0, 1);
  grid->addWidget(first_before_plot_, 1, 0);
  grid->addWidget(first_after_plot_, 1, 1);
  grid->setRowStretch(0, 3);
  grid->setRowStretch(1, 1);
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(caption_);
  layout->addLayout(grid, 1);

  for (HeatmapPlot* plot : {before_, after_}) {
    connect(plot, &HeatmapPlot::cellClicked, this, [this](int column, int row) {
      state_->setCell(column, state_->layerSlot());
      state_->setPosition(row);
    });
    plot->setTooltipText([this, plot](int column, int row, double) {
      const experiment::ComparisonResult* c =
          state_->comparison(plot == before_ ? Side::Before : Side::After);
      if (c == nullptr) {
        return QString();
      }
      QString text =
          tr("position %1 · %2 (tick %3)").arg(row).arg(state_->tickLabel(column)).arg(column);
      for (Metric m : {Metric::FracDiffer, Metric::MaxAbs, Metric::MaxUlp}) {
        text +=
            QStringLiteral("\n%1: %2")
                .arg(metricLabel(m), formatValue(positionValue(*c, m, column, state_->layerSlot(),
                                                               state_->tap(), row)));
      }
      const auto* ref = state_->result()->run(c->reference);
      const std::int64_t* token =
          ref == nullptr ? nullptr : elementAt(ref->canvas_in, {column, row});
      if (token != nullptr) {
        text += tr("\nreference canvas token: %1")
                    .arg(tokenText(state_->document().tokenizer.get(), *token));
      }
      return text;
    });
  }
}

void SpreadView::fill(HeatmapPlot* plot, QCustomPlot* first_plot, std::vector<int>* first,
                      const experiment::ComparisonResult* c) {
  plot->setVisible(c != nullptr);
  first_plot->setVisible(c != nullptr);
  first->clear();
  if (c == nullptr) {
    return;
  }
  const int ticks = state_->ticks();
  const int positions = state_->canvasLength();
  const int slot = state_->layerSlot();
  const int tap = state_->tap();
  std::vector<double> values(static_cast<std::size_t>(ticks) * static_cast<std::size_t>(positions));
  first->assign(static_cast<std::size_t>(positions), -1);
  for (int p = 0; p < positions; ++p) {
    for (int t = 0; t < ticks; ++t) {
      values[static_cast<std::size_t>(p) * static_cast<std::size_t>(ticks) +
             static_cast<std::size_t>(t)] = positionValue(*c, state_->metric(), t, slot, tap, p);
      const double share = positionValue(*c, Metric::FracDiffer, t, slot, tap, p);
      if ((*first)[static_cast<std::size_t>(p)] < 0 && !std::isnan(share) && share > 0) {
        (*first)[static_cast<std::size_t>(p)] = t;
      }
    }
  }
  plot->setGrid(ticks, positions, std::move(values), state_->logScale());
  plot->setAxisLabels(tr("denoising step (tick)"), tr("canvas position"),
                      metricLabel(state_->metric()));
  plot->setTitle(comparisonLabel(*state_->result(), *c));
  plot->setSelectedCell(state_->tick(), state_->position());

  QVector<double> xs;
  QVector<double> ys;
  for (int p = 0; p < positions; ++p) {
    if ((*first)[static_cast<std::size_t>(p)] >= 0) {
      xs << p;
      ys << (*first)[static_cast<std::size_t>(p)];
    }
  }
  first_plot->graph(0)->setData(xs, ys);
  first_plot->xAxis->setRange(-0.5, std::max(positions, 1) - 0.5);
  first_plot->yAxis->setRange(-0.5, std::max(ticks, 1) - 0.5);
  auto* title = qobject_cast<QCPTextElement*>(first_plot->plotLayout()->element(0, 0));
  if (title != nullptr) {
    title->setText(xs.isEmpty() ? tr("no position diverged at this layer and tap")
                                : tr("%1 of %2 positions diverged; first at tick %3")
                                      .arg(xs.size())
                                      .arg(positions)
                                      .arg(*std::min_element(ys.begin(), ys.end())));
  }
  auto* line = qobject_cast<QCPItemStraightLine*>(first_plot->item(0));
  if (line != nullptr) {
    line->setVisible(state_->position() >= 0);
    line->point1->setCoords(state_->position(), 0);
    line->point2->setCoords(state_->position(), 1);
  }
  first_plot->replot(QCustomPlot::rpQueuedReplot);
}

void SpreadView::refresh() {
  if (state_->result() == nullptr) {
    return;
  }
  const int slot = state_->layerSlot();
  caption_->setText(tr("%1 at %2 · metric %3 · click a cell to select the step and position")
                        .arg(state_->tapNames().value(state_->tap()),
                             slot < state_->layers() ? tr("layer %1").arg(slot) : tr("per step"),
                             metricLabel(state_->metric())));
  fill(before_, first_before_plot_, &first_before_, state_->comparison(Side::Before));
  fill(after_, first_after_plot_, &first_after_, state_->comparison(Side::After));
}

QPixmap SpreadView::renderReport(const QSize& size) {
  flush();
  std::vector<PlotColumn> columns;
  columns.push_back({tr("before (as run)"), {before_, first_before_plot_}, {3, 1}});
  if (state_->hasAfter()) {
    columns.push_back({tr("after (row-wise workaround)"), {after_, first_after_plot_}, {3, 1}});
  }
  return composePlots(size, tr("Canvas spread: %1").arg(caption_->text()), columns);
}

}  // namespace batchlens::ui
