// SPDX-License-Identifier: Apache-2.0
// The Overview's table: one row per comparison with its verdict.
#pragma once

#include <memory>

#include <QAbstractTableModel>

#include "core/experiment/experiment.h"

namespace batchlens::ui {

/// Read-only adaptor over an ExperimentResult's comparisons. GUI thread only.
class ComparisonTableModel : public QAbstractTableModel {
  Q_OBJECT

 public:
  enum Column {
    Comparison,
    Text,
    TokensChanged,
    Stop,
    Steps,
    FirstDivergence,
    PositionsDiffering,
    ScoresDiffering,
    ColumnCount
  };
  /// Qt::UserRole on any cell: the comparison id.
  static constexpr int kIdRole = Qt::UserRole;

  explicit ComparisonTableModel(QObject* parent = nullptr);
  void setResult(std::shared_ptr<const experiment::ExperimentResult> result);
  /// The row of a comparison id, or -1.
  int rowOf(const QString& id) const;

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation,
                      int role = Qt::DisplayRole) const override;

 private:
  std::shared_ptr<const experiment::ExperimentResult> result_;
};

}  // namespace batchlens::ui
