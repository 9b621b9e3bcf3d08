// SPDX-License-Identifier: Apache-2.0
#include "ui/explorer_state.h"

#include <cmath>
#include <limits>

#include "core/analysis/story.h"
#include "core/probe/tap_names.h"

namespace batchlens::ui {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

const experiment::NdArray<float>& cellArray(const experiment::ComparisonResult& c, Metric m) {
  switch (m) {
    case Metric::MaxAbs:
      return c.max_abs;
    case Metric::MaxUlp:
      return c.max_ulp;
    case Metric::FracDiffer:
      break;
  }
  return c.frac_differ;
}

const experiment::NdArray<float>& positionArray(const experiment::ComparisonResult& c, Metric m) {
  switch (m) {
    case Metric::MaxAbs:
      return c.pos_max_abs;
    case Metric::MaxUlp:
      return c.pos_max_ulp;
    case Metric::FracDiffer:
      break;
  }
  return c.pos_frac_differ;
}

bool compared(const experiment::ComparisonResult& c, int tick) {
  const auto* flag = elementAt(c.compared, tick);
  return flag != nullptr && *flag != 0;
}

}  // namespace

QString metricLabel(Metric metric) {
  switch (metric) {
    case Metric::MaxAbs:
      return QObject::tr("max |Δ|");
    case Metric::MaxUlp:
      return QObject::tr("max ULP");
    case Metric::FracDiffer:
      break;
  }
  return QObject::tr("share differing");
}

double cellValue(const experiment::ComparisonResult& comparison, Metric metric, int tick, int slot,
                 int tap) {
  const float* v = compared(comparison, tick)
                       ? elementAt(cellArray(comparison, metric), {tick, slot, tap})
                       : nullptr;
  return v == nullptr ? kNaN : *v;
}

double positionValue(const experiment::ComparisonResult& comparison, Metric metric, int tick,
                     int slot, int tap, int position) {
  const float* v = compared(comparison, tick)
                       ? elementAt(positionArray(comparison, metric), {tick, slot, tap, position})
                       : nullptr;
  return v == nullptr ? kNaN : *v;
}

int tapIndex(const experiment::ExperimentResult& result, const char* name) {
  for (std::size_t t = 0; t < result.taps.size(); ++t) {
    if (result.taps[t] == name) {
      return static_cast<int>(t);
    }
  }
  return -1;
}

ExplorerState::ExplorerState(QObject* parent) : QObject(parent) {}

void ExplorerState::setDocument(ExperimentDocument document) {
  document_ = std::move(document);
  comparison_id_.clear();
  tap_ = 0;
  position_ = -1;
  tick_ = 0;
  layer_slot_ = 0;
  if (const auto* r = result()) {
    // The comparison the headline tells: the first main row-0 comparison that diverges.
    comparison_id_ = QString::fromStdString(analysis::headline_comparison(*r));
    show_workaround_ = r->spec.workaround.has_value();
    selectFirstDivergence();
  }
  Q_EMIT documentChanged();
  Q_EMIT comparisonChanged();
  Q_EMIT viewChanged();
  Q_EMIT selectionChanged();
}

void ExplorerState::setModified(bool modified) {
  document_.modified = modified;
}

void ExplorerState::setPath(const QString& path) {
  document_.path = path;
}

void ExplorerState::setComparison(const QString& id) {
  if (id == comparison_id_ || result() == nullptr ||
      result()->comparison(id.toStdString()) == nullptr) {
    return;
  }
  comparison_id_ = id;
  // The user's tap stays: only the cell moves to where this comparison first differs.
  selectFirstDivergence(/*keep_tap=*/true);
  Q_EMIT comparisonChanged();
  Q_EMIT selectionChanged();
}

QString ExplorerState::counterpartId(const QString& id) {
  return QString::fromStdString(experiment::workaround_counterpart(id.toStdString()));
}

const experiment::ComparisonResult* ExplorerState::comparison(Side side) const {
  if (result() == nullptr || comparison_id_.isEmpty()) {
    return nullptr;
  }
  if (side == Side::Before) {
    return result()->comparison(comparison_id_.toStdString());
  }
  if (!show_workaround_) {
    return nullptr;
  }
  const QString other = counterpartId(comparison_id_);
  return other.isEmpty() ? nullptr : result()->comparison(other.toStdString());
}

void ExplorerState::setShowWorkaround(bool show) {
  if (show == show_workaround_) {
    return;
  }
  show_workaround_ = show;
  Q_EMIT viewChanged();
}

void ExplorerState::setTap(int tap) {
  if (tap == tap_ || tap < 0 || tap >= tapNames().size()) {
    return;
  }
  tap_ = tap;
  // Keep the selected layer meaningful: per-step taps live in slot L only.
  const bool per_layer = tapIsPerLayer(tap_);
  layer_slot_ = !per_layer ? layers() : (layer_slot_ >= layers() ? 0 : layer_slot_);
  Q_EMIT viewChanged();
  Q_EMIT selectionChanged();
}

void ExplorerState::setMetric(Metric metric) {
  if (metric == metric_) {
    return;
  }
  metric_ = metric;
  Q_EMIT viewChanged();
}

void ExplorerState::setLogScale(bool log_scale) {
  if (log_scale == log_scale_) {
    return;
  }
  log_scale_ = log_scale;
  Q_EMIT viewChanged();
}

void ExplorerState::setCell(int tick, int layer_slot) {
  if (tick < 0 || tick >= ticks() || layer_slot < 0 || layer_slot > layers()) {
    return;
  }
  if (tick == tick_ && layer_slot == layer_slot_) {
    return;
  }
  tick_ = tick;
  layer_slot_ = layer_slot;
  Q_EMIT selectionChanged();
}

void ExplorerState::setPosition(int position) {
  if (position == position_ || position < -1 || position >= canvasLength()) {
    return;
  }
  position_ = position;
  Q_EMIT selectionChanged();
}

int ExplorerState::ticks() const {
  const auto* c = comparison();
  return c == nullptr ? 0 : static_cast<int>(c->compared.size());
}

int ExplorerState::layers() const {
  return result() == nullptr ? 0 : result()->layers;
}

int ExplorerState::canvasLength() const {
  return result() == nullptr ? 0 : static_cast<int>(result()->canvas_length);
}

QStringList ExplorerState::tapNames() const {
  QStringList names;
  if (result() != nullptr) {
    for (const auto& t : result()->taps) {
      names << QString::fromStdString(t);
    }
  }
  return names;
}

bool ExplorerState::tapIsPerLayer(int tap) const {
  if (result() == nullptr || tap < 0 || static_cast<std::size_t>(tap) >= result()->taps.size()) {
    return true;
  }
  const auto t = probe::tap_from_name(result()->taps[static_cast<std::size_t>(tap)]);
  return !t || probe::tap_is_per_layer(*t);
}

QString ExplorerState::tickLabel(int tick) const {
  const auto* c = comparison();
  if (result() == nullptr || c == nullptr) {
    return {};
  }
  const auto* ref = result()->run(c->reference);
  if (ref == nullptr) {
    return tr("tick %1").arg(tick);
  }
  return QString::fromStdString(analysis::tick_label(*ref, tick));
}

void ExplorerState::selectFirstDivergence(bool keep_tap) {
  const auto* c = comparison();
  if (c == nullptr) {
    return;
  }
  if (!c->first.found()) {
    return;
  }
  // A file's divergence may point outside its own arrays: select only what exists.
  tick_ = c->first.tick < ticks() ? c->first.tick : 0;
  const int tap = tapIndex(*result(), c->first.tap.c_str());
  if (tap >= 0 && !keep_tap) {
    tap_ = tap;
  }
  if (tap_ == tap || !keep_tap) {
    layer_slot_ = c->first.layer >= 0 && c->first.layer < layers() ? c->first.layer : layers();
  } else if (!tapIsPerLayer(tap_)) {
    layer_slot_ = layers();
  } else if (layer_slot_ >= layers()) {
    layer_slot_ = c->first.layer >= 0 && c->first.layer < layers() ? c->first.layer : 0;
  }
  position_ = c->first.position >= 0 && c->first.position < canvasLength()
                  ? static_cast<int>(c->first.position)
                  : -1;
}

}  // namespace batchlens::ui
