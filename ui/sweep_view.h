// SPDX-License-Identifier: Apache-2.0
// Sweep view (issue #19): a sweep file's statistics at a glance. The per-batch-size share of
// texts changed with its 95 % interval (bars, main and workaround side by side), the histogram of
// first-divergence steps, the op families that diverge first, and one row per item × batch size.
// An item opens its kept experiment or is offered for a re-run as a full experiment (the main
// window does either on itemActivated). LibTorch-free public header.
#pragma once

#include <memory>

#include <QPixmap>
#include <QString>
#include <QWidget>

#include "core/analysis/sweep_records.h"
#include "core/analysis/sweep_stats.h"

class QComboBox;
class QCustomPlot;
class QLabel;
class QTableWidget;
class QPushButton;

namespace batchlens::ui {

/// A sweep as the GUI holds it.
struct SweepDocument {
  std::shared_ptr<const analysis::SweepRecords> sweep;
  QString path;  ///< the sweep file (or folder) it was read from
};

class SweepView : public QWidget {
  Q_OBJECT

 public:
  explicit SweepView(QWidget* parent = nullptr);
  void setSweep(const SweepDocument& document);
  const SweepDocument& document() const { return doc_; }

  QLabel* caption() const { return caption_; }
  QCustomPlot* sharePlot() const { return share_; }
  QCustomPlot* stepPlot() const { return steps_; }
  QTableWidget* families() const { return families_; }
  QTableWidget* items() const { return items_; }
  /// Which items the statistics count (issue #35's axes): all, one set of companions, one row
  /// under test, or one of each; hidden for a sweep without the axes. Its data is "C,R" (-1:
  /// any).
  QComboBox* batchRows() const { return batch_rows_; }
  /// The item of the table's selected row, -1 when none.
  int selectedItem() const;
  /// Where --keep-experiments kept `item`'s experiment beside this sweep's file, empty when it
  /// was not kept (DIR/experiments/item-N.h5 for DIR/sweep.h5 and DIR/shards/*.h5).
  QString keptExperiment(int item) const;
  /// The share plot's tooltip text at the bar of `group` and `batch_size`.
  QString shareTooltip(experiment::RunGroup group, int batch_size) const;
  /// The view as a report page of `size`.
  QPixmap renderReport(const QSize& size);

 Q_SIGNALS:
  /// The user asked for an item (double-click or the button): open or re-run it.
  void itemActivated(int item);
  /// The empty tab's button: open the embedded sweep sample.
  void sampleRequested();

 private:
  void fillShare();
  void fillSteps();
  void fillFamilies();
  void fillItems();
  /// stats_ of the items batchRows() selects.
  void computeStats();
  void shareHover(QMouseEvent* event);

  SweepDocument doc_;
  std::vector<analysis::SweepStats> stats_;
  QLabel* caption_ = nullptr;
  QComboBox* batch_rows_ = nullptr;
  QCustomPlot* share_ = nullptr;
  QCustomPlot* steps_ = nullptr;
  QTableWidget* families_ = nullptr;
  QTableWidget* items_ = nullptr;
  QPushButton* open_ = nullptr;
  QPushButton* sample_ = nullptr;  ///< shown instead of the plots while no sweep is open
  QWidget* content_ = nullptr;     ///< the plots and the table
};

}  // namespace batchlens::ui
