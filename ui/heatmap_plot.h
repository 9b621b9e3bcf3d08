// SPDX-License-Identifier: Apache-2.0
// A QCustomPlot colour map with its colour scale: NaN cells (not compared) drawn grey, exact
// values on hover, a click selects a cell. The adaptor every heatmap view of BatchLens uses.
#pragma once

#include <functional>
#include <vector>

#include "ui/qcp.h"

namespace batchlens::ui {

/// GUI thread only. Cells are addressed (column, row); values are row-major.
class HeatmapPlot : public QCustomPlot {
  Q_OBJECT

 public:
  explicit HeatmapPlot(QWidget* parent = nullptr);

  /// Shows `values` ([rows][columns], row-major; NaN = no data). With `log_scale`, zeros are
  /// drawn in the lowest colour and the scale spans the positive values.
  void setGrid(int columns, int rows, std::vector<double> values, bool log_scale);
  void setTitle(const QString& title);
  /// Text labels of the rows (e.g. "per step"); empty = integer row numbers.
  void setRowLabels(const QStringList& labels);
  void setAxisLabels(const QString& x, const QString& y, const QString& scale);
  /// Marks one cell with a frame; (-1, -1) removes the mark.
  void setSelectedCell(int column, int row);
  /// Text of the hover tooltip of a cell; the default shows the value.
  void setTooltipText(std::function<QString(int column, int row, double value)> text);

  int columns() const { return columns_; }
  int rows() const { return rows_; }
  /// The value shown in a cell (NaN outside or without data).
  double value(int column, int row) const;
  /// The cell under a widget position, if any.
  bool cellAt(const QPoint& pos, int* column, int* row) const;
  /// The text the tooltip shows for a cell.
  QString tooltipFor(int column, int row) const;
  /// A rendering of the plot at `size`, independent of the widget's size.
  QPixmap render(const QSize& size);

 Q_SIGNALS:
  void cellClicked(int column, int row);

 protected:
  void mouseMoveEvent(QMouseEvent* event) override;
  void mousePressEvent(QMouseEvent* event) override;

 private:
  QCPTextElement* title_ = nullptr;
  QCPColorMap* map_ = nullptr;
  QCPColorScale* scale_ = nullptr;
  QCPItemRect* mark_ = nullptr;
  int columns_ = 0;
  int rows_ = 0;
  std::vector<double> values_;
  std::function<QString(int, int, double)> tooltip_;
};

/// "0", "0.2341", "3.1e-05": a value with enough digits to be exact at a glance.
QString formatValue(double value);

}  // namespace batchlens::ui
