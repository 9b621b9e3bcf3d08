// SPDX-License-Identifier: Apache-2.0
// Layer × step heatmap: where in depth and time row 0 departs from the reference.
#include <algorithm>
#include <cmath>

#include <QCheckBox>
#include <QComboBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QVBoxLayout>

#include "core/probe/tap_names.h"
#include "ui/heatmap_plot.h"
#include "ui/report_render.h"
#include "ui/views.h"

namespace batchlens::ui {

namespace {

QString tapLabel(const QString& name) {
  const auto tap = probe::tap_from_name(name.toStdString());
  if (!tap) {
    return name;
  }
  return QStringLiteral("%1 (%2)").arg(
      QString::fromUtf8(probe::tap_label(*tap).data(),
                        static_cast<int>(probe::tap_label(*tap).size())),
      name);
}

}  // namespace

LayerStepView::LayerStepView(ExplorerState* state, QWidget* parent) : CoalescedView(state, parent) {
  tap_ = new QComboBox(this);
  tap_->setObjectName(QStringLiteral("TapCombo"));
  tap_->setToolTip(tr("The tapped tensor whose bits are compared"));
  metric_ = new QComboBox(this);
  metric_->setObjectName(QStringLiteral("MetricCombo"));
  for (Metric m : {Metric::FracDiffer, Metric::MaxAbs, Metric::MaxUlp}) {
    metric_->addItem(metricLabel(m), static_cast<int>(m));
  }
  metric_->setToolTip(
      tr("share differing: elements whose bits differ; max |Δ|: largest absolute difference; "
         "max ULP: largest distance in units in the last place"));
  log_ = new QCheckBox(tr("Log scale"), this);
  log_->setToolTip(
      tr("Log colour scale spanning exactly the smallest and the largest "
         "difference shown; white is always 0 (bitwise identical), grey not "
         "compared"));
  log_->setObjectName(QStringLiteral("LogScaleCheck"));
  cell_ = new QLabel(this);
  cell_->setObjectName(QStringLiteral("CellLabel"));
  cell_->setTextInteractionFlags(Qt::TextSelectableByMouse);

  auto* controls = new QHBoxLayout;
  controls->addWidget(new QLabel(tr("Tap:"), this));
  controls->addWidget(tap_, 1);
  controls->addWidget(new QLabel(tr("Metric:"), this));
  controls->addWidget(metric_);
  controls->addWidget(log_);

  before_ = new HeatmapPlot(this);
  before_->setObjectName(QStringLiteral("LayerStepBefore"));
  after_ = new HeatmapPlot(this);
  after_->setObjectName(QStringLiteral("LayerStepAfter"));
  // Equal stretch, not a splitter: the two sides keep equal widths whatever was shown before.
  auto* plots = new QHBoxLayout;
  plots->addWidget(before_, 1);
  plots->addWidget(after_, 1);

  auto* layout = new QVBoxLayout(this);
  layout->addLayout(controls);
  layout->addLayout(plots, 1);
  layout->addWidget(cell_);

  connect(tap_, &QComboBox::currentIndexChanged, this, [this](int i) { state_->setTap(i); });
  connect(metric_, &QComboBox::currentIndexChanged, this,
          [this](int i) { state_->setMetric(static_cast<Metric>(metric_->itemData(i).toInt())); });
  connect(log_, &QCheckBox::toggled, state_, &ExplorerState::setLogScale);
  for (HeatmapPlot* plot : {before_, after_}) {
    connect(plot, &HeatmapPlot::cellClicked, this, [this](int column, int row) {
      state_->setCell(column, state_->tapIsPerLayer(state_->tap()) ? row : state_->layers());
    });
    plot->setTooltipText([this, plot](int column, int row, double) {
      const experiment::ComparisonResult* c =
          state_->comparison(plot == before_ ? Side::Before : Side::After);
      if (c == nullptr) {
        return QString();
      }
      const bool per_layer = state_->tapIsPerLayer(state_->tap());
      const int slot = per_layer ? row : state_->layers();
      QString text = QStringLiteral("%1 · %2\n%3")
                         .arg(per_layer ? tr("layer %1").arg(row) : tr("per-step tap"),
                              state_->tickLabel(column), state_->tapNames().value(state_->tap()));
      for (Metric m : {Metric::FracDiffer, Metric::MaxAbs, Metric::MaxUlp}) {
        text +=
            QStringLiteral("\n%1: %2")
                .arg(metricLabel(m), formatValue(cellValue(*c, m, column, slot, state_->tap())));
      }
      return text;
    });
  }
  connect(state_, &ExplorerState::documentChanged, this, [this] {
    const QSignalBlocker block(tap_);
    tap_->clear();
    for (const QString& name : state_->tapNames()) {
      tap_->addItem(tapLabel(name), name);
    }
  });
}

LayerStepView::Look LayerStepView::stateLook() const {
  return {state_->tap(), state_->metric(), state_->logScale(), state_->tick(), state_->layerSlot()};
}

std::vector<double> LayerStepView::values(const experiment::ComparisonResult* c,
                                          const Look& look) const {
  if (c == nullptr) {
    return {};
  }
  const int ticks = state_->ticks();
  const bool per_layer = state_->tapIsPerLayer(look.tap);
  const int rows = per_layer ? state_->layers() : 1;
  std::vector<double> out(static_cast<std::size_t>(ticks) * static_cast<std::size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    const int slot = per_layer ? r : state_->layers();
    for (int t = 0; t < ticks; ++t) {
      out[static_cast<std::size_t>(r) * static_cast<std::size_t>(ticks) +
          static_cast<std::size_t>(t)] = cellValue(*c, look.metric, t, slot, look.tap);
    }
  }
  return out;
}

void LayerStepView::fill(HeatmapPlot* plot, const experiment::ComparisonResult* c,
                         std::vector<double> cells, const ValueRange& range, const Look& look) {
  plot->setVisible(c != nullptr);
  if (c == nullptr) {
    return;
  }
  const int ticks = state_->ticks();
  const bool per_layer = state_->tapIsPerLayer(look.tap);
  const int rows = per_layer ? state_->layers() : 1;
  plot->setGrid(ticks, rows, std::move(cells), look.log_scale, &range);
  setStepAxis(plot->xAxis, *state_);
  plot->setAxisLabels(tr("denoising step (canvas 1 unless marked)"),
                      per_layer ? tr("layer") : QString(), metricLabel(look.metric));
  plot->setRowLabels(per_layer ? QStringList() : QStringList{tr("per-step tap")});
  const auto* r = state_->result();
  plot->setTitle(comparisonLabel(*r, *c) +
                 (c->first.found() ? QString() : tr(" (bitwise identical)")));
  const int selected_row = per_layer ? look.layer_slot : 0;
  plot->setSelectedCell(look.tick, per_layer && look.layer_slot >= rows ? -1 : selected_row);
}

void LayerStepView::refresh() {
  if (state_->result() == nullptr) {
    before_->setGrid(0, 0, {}, false);
    after_->setVisible(false);
    return;
  }
  {
    const QSignalBlocker block_tap(tap_);
    const QSignalBlocker block_metric(metric_);
    const QSignalBlocker block_log(log_);
    tap_->setCurrentIndex(state_->tap());
    metric_->setCurrentIndex(metric_->findData(static_cast<int>(state_->metric())));
    log_->setChecked(state_->logScale());
  }
  // Before and after share one colour scale: the same colour means the same value.
  const Look look = stateLook();
  std::vector<double> before = values(state_->comparison(Side::Before), look);
  std::vector<double> after = values(state_->comparison(Side::After), look);
  const ValueRange range = ValueRange::of(before).united(ValueRange::of(after));
  fill(before_, state_->comparison(Side::Before), std::move(before), range, look);
  fill(after_, state_->comparison(Side::After), std::move(after), range, look);
  const auto* c = state_->comparison(Side::Before);
  if (c != nullptr) {
    const int slot = state_->layerSlot();
    cell_->setText(
        tr("Selected: %1 · %2 · %3 = %4   (arrow keys move the cell; wheel zooms, drag pans, "
           "double click resets)")
            .arg(
                slot < state_->layers() ? tr("layer %1").arg(slot) : tr("per-step tap"),
                state_->tickLabel(state_->tick()), state_->tapNames().value(state_->tap()),
                formatValue(cellValue(*c, state_->metric(), state_->tick(), slot, state_->tap()))));
  }
}

QPixmap LayerStepView::renderOnset(const QSize& size, const analysis::StoryClause& onset) {
  const auto* r = state_->result();
  const auto* c = state_->comparison(Side::Before);
  if (r == nullptr || c == nullptr) {
    return {};
  }
  if (onset_ == nullptr) {
    // Never shown nor laid out: only rendered, at the figure's size.
    onset_ = new HeatmapPlot(this);
    onset_->setObjectName(QStringLiteral("LayerStepOnset"));
    onset_->hide();
  }
  // The onset made visible whatever the view shows: share differing, log scale, whole grid.
  Look look;
  look.tap = std::max(tapIndex(*r, onset.tap.c_str()), 0);
  look.tick = onset.tick;
  look.layer_slot = onset.layer_slot;
  std::vector<double> cells = values(c, look);
  const ValueRange range = ValueRange::of(cells);
  fill(onset_, c, std::move(cells), range, look);
  onset_->hide();
  onset_->resetZoom();
  const QString tap = state_->tapNames().value(look.tap);
  onset_->setTitle(tr("%1 · tap %2%3 · %4 (log)")
                       .arg(comparisonLabel(*r, *c), tapLabel(tap),
                            onset.tap.empty() ? tr(" (no onset: the first tap)") : QString(),
                            metricLabel(look.metric)));
  return onset_->render(size);
}

QPixmap LayerStepView::renderReport(const QSize& size) {
  flush();
  std::vector<PlotColumn> columns;
  columns.push_back({tr("before (as run)"), {before_}, {}});
  if (state_->hasAfter()) {
    columns.push_back({tr("after (row-wise workaround)"), {after_}, {}});
  }
  return composePlots(
      size,
      tr("Layer × step: %1, %2%3")
          .arg(state_->tapNames().value(state_->tap()), metricLabel(state_->metric()),
               state_->logScale() ? tr(" (log)") : QString()),
      columns);
}

}  // namespace batchlens::ui
