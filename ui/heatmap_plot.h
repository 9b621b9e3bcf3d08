// SPDX-License-Identifier: Apache-2.0
// A QCustomPlot colour map with its colour scale: NaN cells (not compared) drawn grey, zero
// (bitwise identical) white, any difference in a colour-blind-safe scale (viridis) that starts
// well away from white; exact values on hover, a click or the arrow keys select a cell, the
// wheel zooms, a drag pans, a double click resets. The adaptor every heatmap view uses.
#pragma once

#include <functional>
#include <vector>

#include "ui/qcp.h"

namespace batchlens::ui {

/// The values a colour scale spans: the smallest positive and the largest value. Views that
/// show two plots side by side (before / after) give both the union of their ranges.
struct ValueRange {
  double min_positive = 0;  ///< 0 when no value is positive
  double max = 0;
  static ValueRange of(const std::vector<double>& values);
  ValueRange united(const ValueRange& other) const;
};

/// GUI thread only. Cells are addressed (column, row); values are row-major.
class HeatmapPlot : public QCustomPlot {
  Q_OBJECT

 public:
  explicit HeatmapPlot(QWidget* parent = nullptr);

  /// Shows `values` ([rows][columns], row-major; NaN = no data) on a colour scale spanning
  /// `range` (default: the values' own). Zeros are white on both scales; the smallest positive
  /// value gets a clearly visible colour (the log scale spans [min positive, max], at least a
  /// decade: [max / 10, max] when the values are closer than that).
  /// The zoom is kept while the grid keeps its size.
  void setGrid(int columns, int rows, std::vector<double> values, bool log_scale,
               const ValueRange* range = nullptr);
  /// Shows the whole grid again (undoes zoom and pan).
  void resetZoom();
  /// The colour the plot draws a value in (tests: zero is white, positives are not).
  QColor colorOf(double value) const;
  void setTitle(const QString& title);
  QString title() const;
  /// Text labels of the rows (e.g. "per step"); empty = integer row numbers.
  void setRowLabels(const QStringList& labels);
  void setAxisLabels(const QString& x, const QString& y, const QString& scale);
  /// Marks one cell with a frame; (-1, -1) removes the mark.
  void setSelectedCell(int column, int row);
  int selectedColumn() const { return selected_column_; }
  int selectedRow() const { return selected_row_; }
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
  void mouseReleaseEvent(QMouseEvent* event) override;
  void mouseDoubleClickEvent(QMouseEvent* event) override;
  /// Arrow keys move the selected cell (emitted as cellClicked), Home resets the zoom.
  void keyPressEvent(QKeyEvent* event) override;

 private:
  QCPTextElement* title_ = nullptr;
  QCPColorMap* map_ = nullptr;
  QCPColorScale* scale_ = nullptr;
  QCPItemRect* mark_ = nullptr;
  int columns_ = 0;
  int rows_ = 0;
  int selected_column_ = -1;
  int selected_row_ = -1;
  QPoint press_pos_;
  bool pressed_ = false;
  std::vector<double> values_;
  std::function<QString(int, int, double)> tooltip_;
};

/// "0", "0.2341", "3.1e-05": a value with enough digits to be exact at a glance.
QString formatValue(double value);

}  // namespace batchlens::ui
