// SPDX-License-Identifier: Apache-2.0
// The explorer's tabs. Each follows ExplorerState and shows the selected comparison ("before")
// and, when the workaround ran, its counterpart ("after") side by side.
#pragma once

#include <QPixmap>
#include <QWidget>

#include "core/analysis/story.h"
#include "core/ops/policy.h"
#include "ui/explorer_state.h"
#include "ui/heatmap_plot.h"
#include "ui/story_cache.h"

class QCheckBox;
class QComboBox;
class QLabel;
class QSlider;
class QTableView;
class QTableWidget;
class QTextBrowser;
class QCustomPlot;
class QCPGraph;
class QCPBars;
class QCPItemStraightLine;
class QCPAxis;

namespace batchlens::ui {

class ComparisonTableModel;

/// Redraws a view once per event-loop turn however many state signals arrive.
class CoalescedView : public QWidget {
  Q_OBJECT

 public:
  explicit CoalescedView(ExplorerState* state, QWidget* parent = nullptr);
  /// Draws now if a redraw is pending (tests and report export call this).
  void flush();
  /// The view as a report page of `size` (GUI thread).
  virtual QPixmap renderReport(const QSize& size) = 0;

 protected:
  void scheduleRefresh();
  virtual void refresh() = 0;
  ExplorerState* state_;

 private:
  bool pending_ = false;
};

/// Overview: the story headline (each clause a link to its view), the growth plot, one row
/// per comparison with its verdict, plus provenance and the runs.
class OverviewView : public CoalescedView {
  Q_OBJECT

 public:
  explicit OverviewView(ExplorerState* state, QWidget* parent = nullptr);
  QPixmap renderReport(const QSize& size) override;
  /// The growth plot alone at `size` (the composite figure).
  QPixmap renderGrowth(const QSize& size);
  QTableView* table() const { return table_; }
  QLabel* headline() const { return headline_; }
  /// "Culprit: {...} row_wise — with it B=... are bitwise identical to B=1; cost +x % at B=4"
  /// with a "use as workaround" link; hidden unless the experiment came from the finder.
  QLabel* culprit() const { return culprit_; }
  /// The kernels of the op behind the selected comparison's first divergence, at B=1 and at
  /// its batch size (analysis::first_divergence_kernels); hidden without provenance.
  QLabel* kernels() const { return kernels_; }
  /// The exact (fp64) reference at the selected comparison's first divergence: the op and the
  /// step's logits, which batch size lies closer to exact; hidden when the file has none.
  QLabel* exact() const { return exact_; }
  QCustomPlot* growthPlot() const { return growth_; }
  /// The story the headline shows, as last drawn (an object of storyCache()).
  const analysis::Story& story() const;
  /// The stories and growth curves of the shown result, computed once per comparison.
  const StoryCache& storyCache() const { return stories_; }
  /// The provenance / runs panel's HTML.
  QString detailsHtml() const;
  /// The headline as HTML: clauses joined with arrows, as links "clause:N" when `links`.
  static QString headlineHtml(const analysis::Story& story, bool links);
  /// Follows a headline link ("clause:N"): selects its tap and cell, then asks for its view.
  void openClause(const QString& link);

 Q_SIGNALS:
  /// A headline clause asks for a view (analysis::StoryView as int).
  void viewRequested(int view);
  /// The user asked to fill the workaround op list with the culprit finder's fix.
  void culpritFixRequested();

 protected:
  void refresh() override;

 private:
  void fillGrowth();
  /// The growth legend's columns for a plot `width` pixels wide (all of it inside).
  void fitLegend(int width);
  bool eventFilter(QObject* watched, QEvent* event) override;
  QLabel* headline_ = nullptr;
  QLabel* why_ = nullptr;
  QLabel* culprit_ = nullptr;
  QLabel* kernels_ = nullptr;
  QLabel* exact_ = nullptr;
  QCustomPlot* growth_ = nullptr;
  StoryCache stories_;
  const analysis::Story* story_ = nullptr;  ///< in stories_; null before the first draw
  ComparisonTableModel* model_ = nullptr;
  QTableView* table_ = nullptr;
  QTextBrowser* details_ = nullptr;
  QLabel* banner_ = nullptr;
};

/// Layer × step heatmap of the chosen tap and metric.
class LayerStepView : public CoalescedView {
  Q_OBJECT

 public:
  explicit LayerStepView(ExplorerState* state, QWidget* parent = nullptr);
  QPixmap renderReport(const QSize& size) override;
  /// The composite figure's heatmap: the selected comparison ("before") for the tap `onset`
  /// names (the story's onset clause; the result's first tap when it names none), share
  /// differing on the log scale, the whole grid with the onset's cell framed, titled with the
  /// comparison and the tap. Independent of the tap, metric, scale and zoom the view shows.
  QPixmap renderOnset(const QSize& size, const analysis::StoryClause& onset);
  /// The plot renderOnset draws with (never shown), as last drawn.
  HeatmapPlot* onsetPlot() const { return onset_; }
  HeatmapPlot* plot(Side side) const { return side == Side::Before ? before_ : after_; }
  QComboBox* tapCombo() const { return tap_; }
  QComboBox* metricCombo() const { return metric_; }
  QCheckBox* logCheck() const { return log_; }

 protected:
  void refresh() override;

 private:
  /// What one heatmap shows: a tap (index into the result's taps), a metric and scale, and the
  /// cell to frame.
  struct Look {
    int tap = 0;
    Metric metric = Metric::FracDiffer;
    bool log_scale = true;
    int tick = -1;
    int layer_slot = -1;
  };
  /// The view's look: the state's tap, metric, scale and cell.
  Look stateLook() const;
  std::vector<double> values(const experiment::ComparisonResult* c, const Look& look) const;
  void fill(HeatmapPlot* plot, const experiment::ComparisonResult* c, std::vector<double> cells,
            const ValueRange& range, const Look& look);
  QComboBox* tap_ = nullptr;
  QComboBox* metric_ = nullptr;
  QCheckBox* log_ = nullptr;
  QLabel* cell_ = nullptr;
  HeatmapPlot* before_ = nullptr;
  HeatmapPlot* after_ = nullptr;
  HeatmapPlot* onset_ = nullptr;
};

/// Canvas spread: steps × canvas positions for the selected layer and tap, and the first step
/// at which each position diverged.
class SpreadView : public CoalescedView {
  Q_OBJECT

 public:
  explicit SpreadView(ExplorerState* state, QWidget* parent = nullptr);
  QPixmap renderReport(const QSize& size) override;
  HeatmapPlot* plot(Side side) const { return side == Side::Before ? before_ : after_; }
  /// The first tick at which each position diverged (-1: never), as last drawn.
  const std::vector<int>& firstDivergedTick(Side side) const {
    return side == Side::Before ? first_before_ : first_after_;
  }

 protected:
  void refresh() override;

 private:
  std::vector<double> values(const experiment::ComparisonResult* c) const;
  void fill(HeatmapPlot* plot, QCustomPlot* first_plot, std::vector<int>* first,
            const experiment::ComparisonResult* c, std::vector<double> values,
            const ValueRange& range);
  /// "selfcond.soft_embed, per-step tap, share differing": what the view shows.
  QString subject() const;
  QLabel* caption_ = nullptr;
  HeatmapPlot* before_ = nullptr;
  HeatmapPlot* after_ = nullptr;
  QCustomPlot* first_before_plot_ = nullptr;
  QCustomPlot* first_after_plot_ = nullptr;
  std::vector<int> first_before_;
  std::vector<int> first_after_;
};

/// Text diff: reference vs run token by token, stop positions marked, and a step slider that
/// replays both canvases as they were at each denoising step.
class TextDiffView : public CoalescedView {
  Q_OBJECT

 public:
  explicit TextDiffView(ExplorerState* state, QWidget* parent = nullptr);
  QPixmap renderReport(const QSize& size) override;
  QSlider* stepSlider() const { return slider_; }
  QTextBrowser* browser(Side side) const { return side == Side::Before ? before_ : after_; }
  /// The HTML of one side (final diff + canvas replay at the selected step).
  QString html(Side side) const;

 protected:
  void refresh() override;
  /// The aligned canvases take as many positions per row as the panes' width holds.
  void resizeEvent(QResizeEvent* event) override;

 private:
  QSlider* slider_ = nullptr;
  QLabel* step_label_ = nullptr;
  QTextBrowser* before_ = nullptr;
  QTextBrowser* after_ = nullptr;
  bool syncing_ = false;  ///< one pane's scroll is being copied to the other
};

/// Kernels: which kernels each op family launched per layer in one engine's decoder pass (the
/// experiment's kernel provenance), against the B=1 reference's, differing rows marked; above
/// it the kernels at the selected comparison's first divergence, what differs in bold.
class KernelsView : public CoalescedView {
  Q_OBJECT

 public:
  explicit KernelsView(ExplorerState* state, QWidget* parent = nullptr);
  QPixmap renderReport(const QSize& size) override;
  QTableWidget* table() const { return table_; }
  QComboBox* engine() const { return engine_; }
  QCheckBox* selfConditioning() const { return sc_; }
  /// "B=1: …; B=4: …; differs: …" at the first divergence (HTML), "" when unknown.
  QLabel* firstDivergence() const { return first_; }
  /// Rows of the table marked as differing from the reference.
  int differingRows() const { return differing_; }

 protected:
  void refresh() override;

 private:
  void fillTable();
  QLabel* caption_ = nullptr;
  QLabel* first_ = nullptr;
  QComboBox* engine_ = nullptr;
  QCheckBox* sc_ = nullptr;
  QTableWidget* table_ = nullptr;
  int differing_ = 0;
  bool filling_ = false;
  QString last_comparison_;  ///< the comparison whose run the engine list last followed
};

/// Routing: expert-set flips per layer × step, and per position for the selected cell with the
/// reference's router margin (k-th minus (k+1)-th score), so near-ties are visible.
class RoutingView : public CoalescedView {
  Q_OBJECT

 public:
  explicit RoutingView(ExplorerState* state, QWidget* parent = nullptr);
  QPixmap renderReport(const QSize& size) override;
  HeatmapPlot* plot(Side side) const { return side == Side::Before ? before_ : after_; }
  /// The per-position chart of a side, and its title (which layer and step it shows: the same
  /// on both sides).
  QCustomPlot* detail(Side side) const {
    return side == Side::Before ? detail_before_ : detail_after_;
  }
  QString detailTitle(Side side) const;
  /// The layer both per-position charts show: the selected cell's, or for a per-step tap the
  /// layer with the most flips at the selected step on the before side; -1 for none.
  int detailLayer() const;

 protected:
  void refresh() override;

 private:
  void fill(HeatmapPlot* plot, QCustomPlot* detail, const experiment::ComparisonResult* c,
            int layer);
  QLabel* caption_ = nullptr;
  HeatmapPlot* before_ = nullptr;
  HeatmapPlot* after_ = nullptr;
  QCustomPlot* detail_before_ = nullptr;
  QCustomPlot* detail_after_ = nullptr;
};

/// "ref vs B=2", "workaround: ref vs B=4", "B=4 rows vs row 0" for a comparison id.
QString comparisonLabel(const experiment::ExperimentResult& result,
                        const experiment::ComparisonResult& comparison);

/// Labels an axis of ticks of the experiment with denoising steps, counted from 1, and the
/// canvas at each canvas start ("c2·1").
void setStepAxis(QCPAxis* axis, const ExplorerState& state);

/// A policy as people read it: its name where it has one ("issue_workaround",
/// "emulated_h200+row_wise_all"), else its rules ("custom: row_wise {router_proj}"), never raw
/// policy JSON (issue #34).
QString policyLabel(const ops::OpPolicy& policy);

/// One token as display text ("␣Portugal", "⏎"), or "#id" without a tokenizer.
QString tokenText(const text::Tokenizer* tokenizer, std::int64_t id);

}  // namespace batchlens::ui
