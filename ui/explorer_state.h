// SPDX-License-Identifier: Apache-2.0
// What the explorer shows: the experiment, the chosen comparison, tap, metric, scale and the
// selected cell. Every view follows ExplorerState; none of them talk to each other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <vector>

#include <QObject>
#include <QString>
#include <QStringList>

#include "core/experiment/experiment.h"
#include "core/text/tokenizer.h"

namespace batchlens::ui {

/// An experiment as the window holds it: the result, the tokenizer that decodes its ids (null
/// when none is available, e.g. a checkpoint directory that is not on this machine) and where it
/// came from.
struct ExperimentDocument {
  std::shared_ptr<const experiment::ExperimentResult> result;
  std::shared_ptr<const text::Tokenizer> tokenizer;
  QString path;    ///< the file it was read from or saved to; empty for an unsaved run
  QString origin;  ///< "embedded sample", the file name, "run at 12:03"
  bool modified = false;
};

/// The metric of the layer × step and spread heatmaps.
enum class Metric { FracDiffer, MaxAbs, MaxUlp };

/// "share differing", "max |Δ|", "max ULP".
QString metricLabel(Metric metric);

/// Which side of a before/after pair a view shows.
enum class Side { Before, After };

/// The explorer's state. GUI thread only. Setters emit only on change.
class ExplorerState : public QObject {
  Q_OBJECT

 public:
  explicit ExplorerState(QObject* parent = nullptr);

  /// Replaces the document; picks the comparison of the headline (experiment::
  /// headline_comparison), the tap and the cell of its first divergence. Emits documentChanged,
  /// then the rest.
  void setDocument(ExperimentDocument document);
  const ExperimentDocument& document() const { return document_; }
  /// Null until a document is set.
  const experiment::ExperimentResult* result() const { return document_.result.get(); }
  void setModified(bool modified);
  void setPath(const QString& path);

  /// The selected comparison id ("ref__b2"); empty without a result.
  QString comparisonId() const { return comparison_id_; }
  void setComparison(const QString& id);
  /// The comparison a Side shows: Before is the selected one; After is its workaround
  /// counterpart ("ref__b2" -> "wa.ref__wa.b2") when the workaround is shown and exists.
  const experiment::ComparisonResult* comparison(Side side = Side::Before) const;
  /// True when the After side has something to show.
  bool hasAfter() const { return comparison(Side::After) != nullptr; }

  /// Whether the workaround's side is shown beside the selected comparison.
  bool showWorkaround() const { return show_workaround_; }
  void setShowWorkaround(bool show);

  /// Index into result()->taps.
  int tap() const { return tap_; }
  void setTap(int tap);
  Metric metric() const { return metric_; }
  void setMetric(Metric metric);
  bool logScale() const { return log_scale_; }
  void setLogScale(bool log_scale);

  /// The selected cell: tick (denoising step of the experiment) and layer slot (0..L-1, L for
  /// the per-step taps).
  int tick() const { return tick_; }
  int layerSlot() const { return layer_slot_; }
  void setCell(int tick, int layer_slot);
  /// The selected canvas position, -1 for none.
  int position() const { return position_; }
  void setPosition(int position);

  /// Helpers over the result (all safe without one).
  int ticks() const;
  int layers() const;
  int canvasLength() const;
  QStringList tapNames() const;
  /// True when the selected tap is recorded per layer (else once per step, slot L).
  bool tapIsPerLayer(int tap) const;
  /// "canvas 1 · step 12" for a tick (canvases and steps counted from 1), from the reference
  /// run of the comparison.
  QString tickLabel(int tick) const;
  /// The workaround counterpart's id of a comparison id, or empty.
  static QString counterpartId(const QString& id);

 Q_SIGNALS:
  void documentChanged();
  void comparisonChanged();
  /// Tap, metric, scale or the workaround side changed.
  void viewChanged();
  void selectionChanged();

 private:
  void selectFirstDivergence(bool keep_tap = false);

  ExperimentDocument document_;
  QString comparison_id_;
  bool show_workaround_ = true;
  int tap_ = 0;
  Metric metric_ = Metric::FracDiffer;
  bool log_scale_ = true;  ///< the first, tiny difference must be visible at once
  int tick_ = 0;
  int layer_slot_ = 0;
  int position_ = -1;
};

/// The element of `array` at `index`, or null when the index has another rank than the array,
/// lies outside its shape, or the array's data does not hold its shape. Views read every result
/// array through this (or the helpers below): the ticks, layers and positions they index with
/// come from another run, another comparison, the slider or a file, and runs of one file may
/// have different lengths.
template <class T>
const T* elementAt(const experiment::NdArray<T>& array, std::initializer_list<std::int64_t> index) {
  return array.find(index);
}

/// The element `i` of `values`, or null outside it.
template <class T>
const T* elementAt(const std::vector<T>& values, std::int64_t i) {
  return i >= 0 && static_cast<std::uint64_t>(i) < values.size()
             ? &values[static_cast<std::size_t>(i)]
             : nullptr;
}

/// The value of `metric` for a comparison at (tick, slot, tap), or NaN where the comparison did
/// not compare that tick or the tap has no such slot.
double cellValue(const experiment::ComparisonResult& comparison, Metric metric, int tick, int slot,
                 int tap);
/// The per-position value of `metric` at (tick, slot, tap, position), NaN likewise.
double positionValue(const experiment::ComparisonResult& comparison, Metric metric, int tick,
                     int slot, int tap, int position);
/// The tap index of a name in the result, or -1.
int tapIndex(const experiment::ExperimentResult& result, const char* name);

}  // namespace batchlens::ui
