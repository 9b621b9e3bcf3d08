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
    p->yAxis->setLabel(tr("first differs at step"));
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
      QString text = tr("position %1 · %2").arg(row).arg(state_->tickLabel(column));
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

std::vector<double> SpreadView::values(const experiment::ComparisonResult* c) const {
  if (c == nullptr) {
    return {};
  }
  const int ticks = state_->ticks();
  const int positions = state_->canvasLength();
  std::vector<double> out(static_cast<std::size_t>(ticks) * static_cast<std::size_t>(positions));
  for (int p = 0; p < positions; ++p) {
    for (int t = 0; t < ticks; ++t) {
      out[static_cast<std::size_t>(p) * static_cast<std::size_t>(ticks) +
          static_cast<std::size_t>(t)] =
          positionValue(*c, state_->metric(), t, state_->layerSlot(), state_->tap(), p);
    }
  }
  return out;
}

void SpreadView::fill(HeatmapPlot* plot, QCustomPlot* first_plot, std::vector<int>* first,
                      const experiment::ComparisonResult* c, std::vector<double> values,
                      const ValueRange& range) {
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
  first->assign(static_cast<std::size_t>(positions), -1);
  for (int p = 0; p < positions; ++p) {
    for (int t = 0; t < ticks; ++t) {
      const double share = positionValue(*c, Metric::FracDiffer, t, slot, tap, p);
      if ((*first)[static_cast<std::size_t>(p)] < 0 && !std::isnan(share) && share > 0) {
        (*first)[static_cast<std::size_t>(p)] = t;
      }
    }
  }
  plot->setGrid(ticks, positions, std::move(values), state_->logScale(), &range);
  setStepAxis(plot->xAxis, *state_);
  plot->setAxisLabels(tr("denoising step (canvas 1 unless marked)"), tr("canvas position"),
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
  setStepAxis(first_plot->yAxis, *state_);
  auto* title = qobject_cast<QCPTextElement*>(first_plot->plotLayout()->element(0, 0));
  if (title != nullptr) {
    title->setText(xs.isEmpty() ? tr("no position diverged at this layer and tap")
                                : tr("%1 of %2 positions diverged; the first at %3")
                                      .arg(xs.size())
                                      .arg(positions)
                                      .arg(state_->tickLabel(static_cast<int>(
                                          *std::min_element(ys.begin(), ys.end())))));
  }
  auto* line = qobject_cast<QCPItemStraightLine*>(first_plot->item(0));
  if (line != nullptr) {
    line->setVisible(state_->position() >= 0);
    line->point1->setCoords(state_->position(), 0);
    line->point2->setCoords(state_->position(), 1);
  }
  first_plot->replot(QCustomPlot::rpQueuedReplot);
}

QString SpreadView::subject() const {
  const int slot = state_->layerSlot();
  return tr("%1, %2, %3")
      .arg(state_->tapNames().value(state_->tap()),
           slot < state_->layers() ? tr("layer %1").arg(slot) : tr("per-step tap"),
           metricLabel(state_->metric()));
}

void SpreadView::refresh() {
  if (state_->result() == nullptr) {
    return;
  }
  caption_->setText(tr("%1 · click a cell to select the step and position; arrow keys move it, "
                       "the wheel zooms, double click resets")
                        .arg(subject()));
  std::vector<double> before = values(state_->comparison(Side::Before));
  std::vector<double> after = values(state_->comparison(Side::After));
  const ValueRange range = ValueRange::of(before).united(ValueRange::of(after));
  fill(before_, first_before_plot_, &first_before_, state_->comparison(Side::Before),
       std::move(before), range);
  fill(after_, first_after_plot_, &first_after_, state_->comparison(Side::After), std::move(after),
       range);
}

QPixmap SpreadView::renderReport(const QSize& size) {
  flush();
  std::vector<PlotColumn> columns;
  columns.push_back({tr("before (as run)"), {before_, first_before_plot_}, {3, 1}});
  if (state_->hasAfter()) {
    columns.push_back({tr("after (row-wise workaround)"), {after_, first_after_plot_}, {3, 1}});
  }
  return composePlots(size, tr("Canvas spread: %1").arg(subject()), columns);
}

}  // namespace batchlens::ui
