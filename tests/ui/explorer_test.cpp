// SPDX-License-Identifier: Apache-2.0
// The explorer window end to end on the offscreen platform: real experiment files (made by the
// project's own runner), real runs, real exports.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>

#include <QCheckBox>
#include <QComboBox>
#include <QCoreApplication>
#include <QDir>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFile>
#include <QFileInfo>
#include <QImage>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QLineEdit>
#include <QMessageBox>
#include <QMimeData>
#include <QProgressBar>
#include <QPushButton>
#include <QSettings>
#include <QSignalSpy>
#include <QSlider>
#include <QSpinBox>
#include <QStandardPaths>
#include <QTabWidget>
#include <QTableView>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QTest>
#include <QTextBrowser>
#include <QUrl>
#include <gtest/gtest.h>

#include "core/analysis/kernel_evidence.h"
#include "core/analysis/story.h"
#include "core/experiment/command_line.h"
#include "core/experiment/runner.h"
#include "core/io/experiment_file.h"
#include "tests/support/ui_window.h"
#include "ui/comparison_table_model.h"
#include "ui/controllers.h"
#include "ui/heatmap_plot.h"
#include "ui/main_window.h"
#include "ui/report_render.h"
#include "ui/run_panel.h"
#include "ui/views.h"

#include <unistd.h>

namespace batchlens::ui {
namespace {

using test_support::kWaitMs;
using test_support::thisMachine;

experiment::ExperimentSpec demoSpec(const std::string& workaround) {
  experiment::ExperimentSpec s =
      test_support::smallDemoSpec(11, 6, ops::OpPolicy::emulated_split_k());
  if (!workaround.empty()) {
    s.workaround = ops::policy_from_text(workaround).value();
  }
  return s;
}

// Experiment files made once per process: with and without the workaround group.
const std::string& fixtureFile(const std::string& workaround) {
  return test_support::experimentFile(
      "ui_" + (workaround.empty() ? std::string("plain") : workaround), demoSpec(workaround));
}

experiment::ExperimentResult readBack(const std::string& path) {
  auto r = io::read_experiment(path);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? r.value() : experiment::ExperimentResult{};
}

class ExplorerTest : public test_support::WindowTest {
 protected:
  ExplorerTest() : WindowTest("explorer_test", QSize(1400, 900)) {}

  // Clicks the centre of a heatmap cell like a user.
  static void clickCell(HeatmapPlot* plot, int column, int row) {
    plot->replot();
    const QPoint at(static_cast<int>(plot->xAxis->coordToPixel(column)),
                    static_cast<int>(plot->yAxis->coordToPixel(row)));
    QTest::mouseClick(plot, Qt::LeftButton, Qt::NoModifier, at);
  }
};

TEST_F(ExplorerTest, OpeningAFileFillsTheViewsWithItsNumbers) {
  const std::string path = fixtureFile("issue_workaround");
  const auto file = readBack(path);
  open(path);
  ExplorerState* state = window_->state();
  ASSERT_NE(state->result(), nullptr);
  EXPECT_EQ(state->result()->comparisons.size(), file.comparisons.size());

  // The first diverging main comparison is selected, at its first divergence.
  const auto* c = state->comparison(Side::Before);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->reference, "ref");
  ASSERT_TRUE(c->first.found());
  EXPECT_EQ(state->tick(), c->first.tick);
  const auto& fc = *file.comparison(c->id);

  // Overview: one row per comparison, with the file's verdicts.
  auto* table = window_->overview()->table();
  ASSERT_EQ(table->model()->rowCount(), static_cast<int>(file.comparisons.size()));
  for (int row = 0; row < table->model()->rowCount(); ++row) {
    const auto& fcr = file.comparisons[static_cast<std::size_t>(row)];
    if (fcr.kind != experiment::ComparisonKind::Row0) {
      continue;
    }
    EXPECT_TRUE(table->model()->index(row, 2).data().toString().startsWith(
        QStringLiteral("%1 of ").arg(fcr.tokens_changed)));
    EXPECT_EQ(table->model()->index(row, 5).data().toString().toStdString(),
              experiment::describe(fcr.first));
  }
  EXPECT_TRUE(window_->overview()->detailsHtml().contains(QStringLiteral("EMULATED")));

  // Layer × step: a few cells equal the file's frac_differ, in every layer and several ticks.
  HeatmapPlot* heat = window_->layerStep()->plot(Side::Before);
  const int tap = state->tap();
  ASSERT_TRUE(state->tapIsPerLayer(tap));
  ASSERT_EQ(heat->columns(), static_cast<int>(fc.compared.size()));
  ASSERT_EQ(heat->rows(), file.layers);
  int checked = 0;
  for (int t = 0; t < heat->columns(); t += 3) {
    for (int l = 0; l < file.layers; ++l) {
      if (fc.compared[static_cast<std::size_t>(t)] == 0) {
        EXPECT_TRUE(std::isnan(heat->value(t, l)));
        continue;
      }
      EXPECT_FLOAT_EQ(static_cast<float>(heat->value(t, l)), fc.frac_differ.at({t, l, tap}));
      ++checked;
    }
  }
  EXPECT_GT(checked, 4);
  // The metric switch shows max ULP from the file.
  window_->layerStep()->metricCombo()->setCurrentIndex(2);
  flushViews();
  EXPECT_FLOAT_EQ(static_cast<float>(heat->value(c->first.tick, c->first.layer)),
                  fc.max_ulp.at({c->first.tick, c->first.layer, tap}));
  EXPECT_GT(heat->value(c->first.tick, c->first.layer), 0);
  const QString tip = heat->tooltipFor(c->first.tick, c->first.layer);
  EXPECT_TRUE(tip.contains(QStringLiteral("max ULP"))) << tip.toStdString();

  // The workaround's side is shown beside, from the wa.* comparison.
  ASSERT_TRUE(state->hasAfter());
  const auto& fa =
      *file.comparison(ExplorerState::counterpartId(QString::fromStdString(c->id)).toStdString());
  HeatmapPlot* after = window_->layerStep()->plot(Side::After);
  EXPECT_FLOAT_EQ(static_cast<float>(after->value(c->first.tick, c->first.layer)),
                  fa.max_ulp.at({c->first.tick, c->first.layer, tap}));

  // Spread: positions of the selected layer equal the file's per-position share.
  window_->layerStep()->metricCombo()->setCurrentIndex(0);
  flushViews();
  HeatmapPlot* spread = window_->spread()->plot(Side::Before);
  ASSERT_EQ(spread->rows(), static_cast<int>(file.canvas_length));
  const int slot = state->layerSlot();
  for (int p = 0; p < spread->rows(); p += 5) {
    EXPECT_FLOAT_EQ(static_cast<float>(spread->value(state->tick(), p)),
                    fc.pos_frac_differ.at({state->tick(), slot, tap, p}));
  }

  // Routing: flips per layer × step are the file's counts.
  HeatmapPlot* routing = window_->routing()->plot(Side::Before);
  for (int t = 0; t < routing->columns(); t += 2) {
    if (fc.compared[static_cast<std::size_t>(t)] == 0) {
      continue;
    }
    for (int l = 0; l < file.layers; ++l) {
      int flips = 0;
      for (std::int64_t p = 0; p < file.canvas_length; ++p) {
        flips += fc.routing_flips.at({t, l, p}) != 0 ? 1 : 0;
      }
      EXPECT_EQ(routing->value(t, l), flips);
    }
  }

  // Text diff: the run's text and the verdict are there.
  const QString html = window_->textDiff()->html(Side::Before);
  EXPECT_TRUE(
      html.contains(fc.tokens_identical ? QStringLiteral("identical") : QStringLiteral("DIFFERS")));
  // The picker lists every comparison and follows the selection.
  EXPECT_EQ(window_->comparisonPicker()->count(), static_cast<int>(file.comparisons.size()));
  EXPECT_EQ(window_->comparisonPicker()->currentData().toString().toStdString(), c->id);
  EXPECT_TRUE(
      window_->recentFiles().contains(QFileInfo(QString::fromStdString(path)).absoluteFilePath()));
}

// issue #16: the headline tells the result in one sentence, numbered as everywhere (canvas and
// step from 1), and each clause opens its view with its cell selected.
TEST_F(ExplorerTest, HeadlineClausesOpenTheirViews) {
  const std::string path = fixtureFile("issue_workaround");
  const auto file = readBack(path);
  open(path);
  OverviewView* overview = window_->overview();
  const QString headline = overview->headline()->text();
  const auto story = analysis::build_story(file, window_->state()->comparisonId().toStdString());
  ASSERT_GE(story.clauses.size(), 3U);
  EXPECT_TRUE(headline.contains(QStringLiteral("clause:0")));
  EXPECT_TRUE(headline.contains(QStringLiteral("first differs at canvas 1 · step ")))
      << headline.toStdString();
  EXPECT_FALSE(headline.contains(QStringLiteral("canvas 0")));
  EXPECT_FALSE(overview->story().why.empty());
  // The tap of the onset is selected by opening the first clause, on the Layer × Step tab.
  window_->state()->setTap(window_->state()->tap() == 0 ? 1 : 0);
  overview->openClause(QStringLiteral("clause:0"));
  EXPECT_EQ(window_->tabs()->currentWidget(), window_->layerStep());
  EXPECT_EQ(window_->state()->tapNames().value(window_->state()->tap()).toStdString(),
            story.clauses[0].tap);
  EXPECT_EQ(window_->state()->tick(), story.clauses[0].tick);
  for (std::size_t i = 0; i < story.clauses.size(); ++i) {
    if (story.clauses[i].view == analysis::StoryView::TextDiff) {
      overview->openClause(QStringLiteral("clause:%1").arg(i));
      EXPECT_EQ(window_->tabs()->currentWidget(), window_->textDiff());
    }
  }
  // A clause about a layer (the routing flip) never leaves a per-step tap on a layer slot.
  for (std::size_t i = 0; i < story.clauses.size(); ++i) {
    const auto& clause = story.clauses[i];
    if (clause.view == analysis::StoryView::Routing && clause.layer_slot >= 0) {
      const int per_step = tapIndex(file, "logits");
      ASSERT_GE(per_step, 0);
      window_->state()->setTap(per_step);
      overview->openClause(QStringLiteral("clause:%1").arg(i));
      EXPECT_EQ(window_->tabs()->currentWidget(), window_->routing());
      EXPECT_TRUE(window_->state()->tapIsPerLayer(window_->state()->tap()));
      EXPECT_EQ(window_->state()->layerSlot(), clause.layer_slot);
    }
  }
  overview->openClause(QStringLiteral("clause:99"));  // ignored
  // The growth plot draws every main row-0 comparison on a log axis.
  flushViews();
  QCustomPlot* growth = overview->growthPlot();
  EXPECT_EQ(growth->yAxis->scaleType(), QCPAxis::stLogarithmic);
  EXPECT_GE(growth->graphCount(), 2);
  int drawn = 0;
  for (int g = 0; g < growth->graphCount(); ++g) {
    drawn += growth->graph(g)->dataCount() > 0 ? 1 : 0;
  }
  EXPECT_GE(drawn, 1);
  // issue #34: the onset shows: steps where nothing differs sit on the axis floor (a log axis
  // cannot draw 0) and the selected curve leaves it at its first divergence.
  const double floor = growth->yAxis->range().lower;
  bool on_floor = false;
  bool above = false;
  for (int g = 0; g < growth->graphCount(); ++g) {
    for (auto it = growth->graph(g)->data()->constBegin();
         it != growth->graph(g)->data()->constEnd(); ++it) {
      EXPECT_GE(it->value, floor);
      on_floor = on_floor || it->value == floor;
      above = above || it->value > floor;
    }
  }
  EXPECT_TRUE(on_floor);
  EXPECT_TRUE(above);
  // The legend stays inside a narrow figure: its columns fit the width.
  const QPixmap narrow = overview->renderGrowth(QSize(360, 260));
  EXPECT_EQ(narrow.width(), 360);
  ASSERT_GT(growth->legend->itemCount(), 0);
  for (int i = 0; i < growth->legend->itemCount(); ++i) {
    EXPECT_LE(growth->legend->item(i)->outerRect().right(), 360) << i;
  }
  // Tick labels count canvases and steps from 1.
  EXPECT_EQ(window_->state()->tickLabel(0), QStringLiteral("canvas 1 · step 1"));
  // Every column of the table explains itself.
  for (int c = 0; c < overview->table()->model()->columnCount(); ++c) {
    EXPECT_FALSE(overview->table()
                     ->model()
                     ->headerData(c, Qt::Horizontal, Qt::ToolTipRole)
                     .toString()
                     .isEmpty())
        << c;
  }
}

// issue #16: one colour scale for before and after, 0 white and the smallest difference
// clearly coloured; the log scale is the default.
TEST_F(ExplorerTest, BeforeAndAfterShareOneColourScale) {
  open(fixtureFile("issue_workaround"));
  EXPECT_TRUE(window_->state()->logScale());
  window_->tabs()->setCurrentWidget(window_->layerStep());
  flushViews();
  HeatmapPlot* before = window_->layerStep()->plot(Side::Before);
  HeatmapPlot* after = window_->layerStep()->plot(Side::After);
  ASSERT_TRUE(after->isVisible());
  const QColor white(0xff, 0xff, 0xff);
  EXPECT_EQ(before->colorOf(0.0), white);
  double smallest = 1e300;
  double largest = 0;
  for (HeatmapPlot* p : {before, after}) {
    for (int c = 0; c < p->columns(); ++c) {
      for (int r = 0; r < p->rows(); ++r) {
        const double v = p->value(c, r);
        if (!std::isnan(v) && v > 0) {
          smallest = std::min(smallest, v);
          largest = std::max(largest, v);
        }
      }
    }
  }
  ASSERT_LT(smallest, 1e300);
  for (double v : {smallest, largest}) {
    EXPECT_EQ(before->colorOf(v), after->colorOf(v)) << v;
    const QColor c = before->colorOf(v);
    // Far from white: the darkest channel well below 0xff.
    EXPECT_LT(std::min({c.red(), c.green(), c.blue()}), 0xc0) << v;
  }
  window_->layerStep()->logCheck()->setChecked(false);
  flushViews();
  EXPECT_EQ(before->colorOf(0.0), white);
}

// issue #34: values within a few percent of each other (0.0122-0.0148) are not spread over
// the whole log scale: it spans at least a decade, so they keep nearly one colour.
TEST(HeatmapScale, LogScaleSpansAtLeastADecade) {
  HeatmapPlot plot;
  plot.resize(400, 300);
  plot.setGrid(3, 1, {0.0122, 0.0135, 0.0148}, /*log_scale=*/true);
  const auto distance = [](const QColor& a, const QColor& b) {
    return std::abs(a.red() - b.red()) + std::abs(a.green() - b.green()) +
           std::abs(a.blue() - b.blue());
  };
  const QColor top = plot.colorOf(0.0148);
  const int close = distance(plot.colorOf(0.0122), top);
  const int decade = distance(plot.colorOf(0.00148), top);
  EXPECT_GT(decade, 0);
  EXPECT_LT(close * 4, decade) << "close values " << close << " apart, a decade " << decade;
  // Values a decade and more apart keep the whole scale: the smallest clearly coloured.
  plot.setGrid(2, 1, {1e-4, 1e-1}, true);
  const QColor small = plot.colorOf(1e-4);
  EXPECT_LT(std::min({small.red(), small.green(), small.blue()}), 0xf0);
  EXPECT_GT(distance(small, plot.colorOf(1e-1)), 100);
}

// issue #16: the two sides keep equal widths after tab switches; the tap survives another
// comparison; arrow keys move the selected cell; wheel zooms and double click resets.
TEST_F(ExplorerTest, HeatmapsKeepTheirLayoutTapAndRespondToKeys) {
  open(fixtureFile("issue_workaround"));
  QTabWidget* tabs = window_->tabs();
  tabs->setCurrentWidget(window_->textDiff());
  window_->resize(1500, 950);
  QCoreApplication::processEvents();
  tabs->setCurrentWidget(window_->layerStep());
  QCoreApplication::processEvents();
  flushViews();
  const int wb = window_->layerStep()->plot(Side::Before)->width();
  const int wa = window_->layerStep()->plot(Side::After)->width();
  EXPECT_LE(std::abs(wb - wa), std::max(wb, wa) / 20) << wb << " vs " << wa;

  ExplorerState* state = window_->state();
  const int tap = state->tap() == 0 ? 1 : 0;
  state->setTap(tap);
  for (const auto& c : state->result()->comparisons) {
    if (c.kind == experiment::ComparisonKind::Row0 &&
        QString::fromStdString(c.id) != state->comparisonId()) {
      state->setComparison(QString::fromStdString(c.id));
      break;
    }
  }
  EXPECT_EQ(state->tap(), tap);

  flushViews();
  HeatmapPlot* plot = window_->layerStep()->plot(Side::Before);
  state->setCell(1, state->tapIsPerLayer(tap) ? 0 : state->layers());
  flushViews();
  plot->setFocus();
  QTest::keyClick(plot, Qt::Key_Right);
  EXPECT_EQ(state->tick(), 2);
  QTest::keyClick(plot, Qt::Key_Left);
  QTest::keyClick(plot, Qt::Key_Left);
  EXPECT_EQ(state->tick(), 0);
  const QCPRange full = plot->xAxis->range();
  plot->xAxis->scaleRange(0.5, plot->xAxis->range().center());
  EXPECT_LT(plot->xAxis->range().size(), full.size());
  flushViews();  // a redraw keeps the zoom
  EXPECT_LT(plot->xAxis->range().size(), full.size());
  QTest::mouseDClick(plot, Qt::LeftButton, Qt::NoModifier, plot->rect().center());
  EXPECT_DOUBLE_EQ(plot->xAxis->range().size(), full.size());
}

TEST_F(ExplorerTest, ClickingAHeatmapCellDrivesSpreadAndText) {
  open(fixtureFile("issue_workaround"));
  ExplorerState* state = window_->state();
  window_->tabs()->setCurrentIndex(1);
  HeatmapPlot* heat = window_->layerStep()->plot(Side::Before);
  const int target_tick = 2;
  const int target_layer = 1;
  ASSERT_TRUE(target_tick != state->tick() || target_layer != state->layerSlot());
  const QString html_before = window_->textDiff()->html(Side::Before);
  clickCell(heat, target_tick, target_layer);
  EXPECT_EQ(state->tick(), target_tick);
  EXPECT_EQ(state->layerSlot(), target_layer);
  flushViews();
  // The spread marks the chosen step and shows the chosen layer's positions.
  const auto* c = state->comparison(Side::Before);
  HeatmapPlot* spread = window_->spread()->plot(Side::Before);
  for (int p = 0; p < spread->rows(); p += 7) {
    const double expected =
        positionValue(*c, Metric::FracDiffer, target_tick, target_layer, state->tap(), p);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(spread->value(target_tick, p)));
    } else {
      EXPECT_DOUBLE_EQ(spread->value(target_tick, p), expected);
    }
  }
  // The text diff replays the canvas at that step, and its slider sits there.
  EXPECT_EQ(window_->textDiff()->stepSlider()->value(), target_tick);
  const QString html_after = window_->textDiff()->html(Side::Before);
  EXPECT_NE(html_before, html_after);
  EXPECT_TRUE(html_after.contains(
      QStringLiteral("Canvas in at %1").arg(window_->state()->tickLabel(target_tick))))
      << html_after.toStdString();
  EXPECT_FALSE(html_after.contains(QStringLiteral("(tick"))) << "one numbering: no ticks shown";

  // Clicking a spread cell selects the position; the slider moves the step.
  window_->tabs()->setCurrentIndex(2);
  clickCell(spread, 4, 9);
  EXPECT_EQ(state->position(), 9);
  EXPECT_EQ(state->tick(), 4);
  window_->textDiff()->stepSlider()->setValue(1);
  EXPECT_EQ(state->tick(), 1);
}

TEST_F(ExplorerTest, WorkaroundToggleStartsARunWithTheWorkaroundOps) {
  open(fixtureFile(""));
  ASSERT_FALSE(window_->state()->hasAfter());
  RunPanel* panel = window_->runPanel();
  panel->setSpec(demoSpec(""));
  panel->setWorkaroundFamily(QStringLiteral("lm_head"), true, 0, -1);
  QSignalSpy finished(window_->runController(), &RunController::finished);
  QSignalSpy shown(window_.get(), &MainWindow::documentShown);
  panel->workaroundCheck()->click();
  ASSERT_TRUE(window_->runController()->isRunning());
  const auto& spec = window_->runController()->lastSpec();
  ASSERT_TRUE(spec.workaround.has_value());
  // router_proj + selfcond_matmul (the preset) and the added lm_head, all row-wise.
  std::set<std::string> families;
  for (const auto& rule : spec.workaround->rules) {
    EXPECT_EQ(rule.strategy, ops::Strategy::RowWise);
    EXPECT_EQ(rule.first_layer, 0);
    EXPECT_EQ(rule.last_layer, -1);
    for (int f = 0; f < ops::kOpFamilyCount; ++f) {
      if (rule.families.test(static_cast<std::size_t>(f))) {
        families.insert(std::string(ops::family_name(static_cast<ops::OpFamily>(f))));
      }
    }
  }
  EXPECT_EQ(families, (std::set<std::string>{"router_proj", "selfcond_matmul", "lm_head"}));
  EXPECT_FALSE(panel->runButton()->isEnabled());
  EXPECT_TRUE(panel->cancelButton()->isEnabled());
  ASSERT_TRUE(shown.wait(kWaitMs)) << window_->lastError().toStdString();
  // The new result shows the workaround beside the comparison.
  EXPECT_EQ(window_->state()->result()->spec.workaround, spec.workaround);
  EXPECT_TRUE(window_->state()->hasAfter());
  EXPECT_TRUE(panel->runButton()->isEnabled());
  flushViews();
  EXPECT_TRUE(window_->layerStep()->plot(Side::After)->isVisibleTo(window_->layerStep()));
  // Switching the toggle off hides the after side without running.
  panel->workaroundCheck()->click();
  EXPECT_FALSE(window_->runController()->isRunning());
  EXPECT_FALSE(window_->state()->hasAfter());
}

// The demo on the H200's emulation profile, short: row 0 of B=2 diverges at once.
experiment::ExperimentSpec emulatedDemoSpec() {
  experiment::ExperimentSpec s = demoSpec("");
  s.policy = ops::OpPolicy::emulation_profile("emulated_h200");
  s.overrides.max_new_tokens = 32;
  s.overrides.max_denoising_steps = 4;
  s.repeats = 0;
  return s;
}

// Run > Find culprit with the batch-invariant strategy on the H200's emulation profile: the
// result shows the culprit line, its link fills the op list with the fix and its strategy.
TEST_F(ExplorerTest, FindCulpritShowsTheCulpritAndFillsTheOpList) {
  RunPanel* panel = window_->runPanel();
  panel->setSpec(emulatedDemoSpec());
  QComboBox* strategy = panel->workaroundStrategyBox();
  strategy->setCurrentIndex(strategy->findData(static_cast<int>(ops::Strategy::BatchInvariant)));
  QSignalSpy shown(window_.get(), &MainWindow::documentShown);
  window_->findCulprit();
  ASSERT_TRUE(window_->runController()->isRunning());
  ASSERT_TRUE(shown.wait(4 * kWaitMs)) << window_->lastError().toStdString();
  flushViews();
  const auto* r = window_->state()->result();
  ASSERT_TRUE(r->culprit.has_value());
  ASSERT_TRUE(r->culprit->found) << r->culprit->verdict;
  QLabel* line = window_->overview()->culprit();
  EXPECT_TRUE(line->isVisibleTo(window_->overview()));
  EXPECT_TRUE(line->text().contains(QStringLiteral("Culprit: {selfcond_matmul} batch_invariant")))
      << line->text().toStdString();
  EXPECT_TRUE(line->toolTip().contains(QStringLiteral("trials"))) << line->toolTip().toStdString();
  // Reset the list to the preset (row-wise), then one click on the link.
  panel->resetWorkaroundToPreset();
  ASSERT_EQ(panel->workaroundStrategy(), ops::Strategy::RowWise);
  Q_EMIT line->linkActivated(QStringLiteral("culprit:use"));
  EXPECT_EQ(panel->workaroundStrategy(), ops::Strategy::BatchInvariant);
  const ops::OpPolicy filled = panel->workaroundPolicy();
  ASSERT_EQ(filled.rules.size(), 1U);
  EXPECT_EQ(filled.rules[0].strategy, ops::Strategy::BatchInvariant);
  EXPECT_EQ(filled.rules[0].families, r->culprit->fix.rules[0].families);
}

// Issue #35: a run from the panel explains its divergence against the exact value: under the
// first divergence the overview's exact line (the op and the step's logits in fp64, which batch
// size lies closer), the same in the comparison table's tooltip; a file without it hides it.
TEST_F(ExplorerTest, ARunShowsTheExactReferenceAtTheFirstDivergence) {
  RunPanel* panel = window_->runPanel();
  panel->setSpec(emulatedDemoSpec());
  QSignalSpy shown(window_.get(), &MainWindow::documentShown);
  panel->runButton()->click();
  ASSERT_TRUE(window_->runController()->isRunning());
  ASSERT_TRUE(shown.wait(4 * kWaitMs)) << window_->lastError().toStdString();
  flushViews();
  const auto* r = window_->state()->result();
  ASSERT_TRUE(r->exact.has_value());
  QLabel* line = window_->overview()->exact();
  EXPECT_TRUE(line->isVisibleTo(window_->overview()));
  EXPECT_TRUE(line->text().contains(QStringLiteral("Exact (fp64): the op: selfcond_matmul")))
      << line->text().toStdString();
  EXPECT_TRUE(line->text().contains(QStringLiteral("the step's logits: lm_head")))
      << line->text().toStdString();
  QTableView* table = window_->overview()->table();
  const int row = table->currentIndex().row();
  ASSERT_GE(row, 0);
  const QString tip = table->model()
                          ->index(row, ComparisonTableModel::FirstDivergence)
                          .data(Qt::ToolTipRole)
                          .toString();
  EXPECT_TRUE(tip.contains(QStringLiteral("exact (fp64): the op: selfcond_matmul")))
      << tip.toStdString();
  open(fixtureFile(""));
  flushViews();
  EXPECT_FALSE(window_->overview()->exact()->isVisibleTo(window_->overview()));
}

// The Kernels tab and the Overview's kernel line on an experiment with kernel provenance: the
// emulated split differs between B=1 and B=2, so the ops it covers are marked; a file without
// provenance says so.
TEST_F(ExplorerTest, KernelsTabShowsWhatRanAndMarksTheOpsThatDiffer) {
  experiment::ExperimentSpec s = demoSpec("");
  s.kernels = true;
  open(test_support::experimentFile("ui_kernels", s));
  flushViews();
  KernelsView* view = window_->kernels();
  view->flush();
  EXPECT_GT(view->table()->rowCount(), 10);
  EXPECT_GE(view->differingRows(), 1);
  EXPECT_EQ(view->engine()->currentData().toString(), window_->state()->comparison()->run.c_str());
  EXPECT_TRUE(view->firstDivergence()->isVisibleTo(view));
  EXPECT_TRUE(view->firstDivergence()->text().contains(QStringLiteral("differs: path: emulated")))
      << view->firstDivergence()->text().toStdString();
  QLabel* line = window_->overview()->kernels();
  EXPECT_TRUE(line->isVisibleTo(window_->overview()));
  EXPECT_TRUE(line->text().contains(QStringLiteral("B=1: emulated split-K")))
      << line->text().toStdString();
  // The reference's own pass is the reference: nothing marked.
  view->engine()->setCurrentIndex(view->engine()->findData(QStringLiteral("ref")));
  EXPECT_EQ(view->differingRows(), 0);
  // Its link opens the tab.
  Q_EMIT line->linkActivated(QStringLiteral("kernels:view"));
  EXPECT_EQ(window_->findChild<QTabWidget*>(QStringLiteral("ExplorerTabs"))->currentWidget(), view);

  open(fixtureFile(""));
  flushViews();
  view->flush();
  EXPECT_EQ(view->table()->rowCount(), 0);
  EXPECT_FALSE(window_->overview()->kernels()->isVisibleTo(window_->overview()));
}

// File > Export minimal repro: in the background, with the run panel's progress, the selected
// comparison's first divergent op into a folder.
TEST_F(ExplorerTest, ExportMinimalReproWritesTheFolderOfTheSelectedComparison) {
  experiment::ExperimentSpec s = demoSpec("");
  s.kernels = true;
  open(test_support::experimentFile("ui_kernels", s));
  flushViews();
  const QString dir = QDir(QString::fromStdString(::testing::TempDir()))
                          .filePath(QStringLiteral("bl_ui_repro_%1").arg(::getpid()));
  QDir(dir).removeRecursively();
  QSignalSpy exported(window_.get(), &MainWindow::reproExported);
  ASSERT_TRUE(window_->exportReproTo(dir)) << window_->lastError().toStdString();
  EXPECT_TRUE(window_->runController()->isRunning());
  ASSERT_TRUE(exported.wait(kWaitMs)) << window_->lastError().toStdString();
  EXPECT_EQ(exported.front().front().toString(), dir);
  EXPECT_FALSE(window_->runController()->isRunning());
  for (const char* f : {"repro.py", "inputs.safetensors", "op.json", "README.md"}) {
    EXPECT_TRUE(QFileInfo::exists(QDir(dir).filePath(QString::fromLatin1(f)))) << f;
  }
  QFile op(QDir(dir).filePath(QStringLiteral("op.json")));
  ASSERT_TRUE(op.open(QIODevice::ReadOnly));
  const QByteArray json = op.readAll();
  // Every GEMM is emulated here: the first divergence is layer 0's first projection.
  EXPECT_TRUE(json.contains("\"family\": \"q_proj\"")) << json.toStdString();
  EXPECT_TRUE(json.contains("\"reproduces\": true")) << json.toStdString();
  EXPECT_TRUE(json.contains(
      ("\"comparison\": \"" + window_->state()->comparisonId().toStdString() + "\"").c_str()));
  auto* box = window_->findChild<QMessageBox*>(QStringLiteral("ReproDialog"));
  ASSERT_NE(box, nullptr);
  EXPECT_TRUE(box->detailedText().contains(QStringLiteral("python3 repro.py --emulate")))
      << box->detailedText().toStdString();
  QDir(dir).removeRecursively();
}

TEST_F(ExplorerTest, CancelStopsARunningDemoAndKeepsTheOldResult) {
  open(fixtureFile(""));
  const auto* before = window_->state()->result();
  RunPanel* panel = window_->runPanel();
  auto spec = demoSpec("");
  spec.overrides.max_denoising_steps = 48;
  spec.overrides.max_new_tokens = 256;
  panel->setSpec(spec);
  QSignalSpy progress(window_->runController(), &RunController::progressChanged);
  QSignalSpy cancelled(window_->runController(), &RunController::cancelled);
  panel->runButton()->click();
  ASSERT_TRUE(window_->runController()->isRunning());
  ASSERT_TRUE(progress.wait(kWaitMs));
  // Wait for a denoising step to be reported, not only the weights loading.
  for (int i = 0; i < 200 && window_->runPanel()->progressBar()->maximum() == 0; ++i) {
    progress.wait(500);
  }
  panel->cancelButton()->click();
  ASSERT_TRUE(cancelled.wait(kWaitMs));
  EXPECT_FALSE(window_->runController()->isRunning());
  EXPECT_EQ(window_->state()->result(), before);
  EXPECT_TRUE(panel->runButton()->isEnabled());
  EXPECT_FALSE(panel->cancelButton()->isEnabled());
}

TEST_F(ExplorerTest, ExportWritesPngsOfTheRightSizeAndASummaryOfTheFile) {
  const std::string path = fixtureFile("issue_workaround");
  const auto file = readBack(path);
  open(path);
  QTemporaryDir dir;
  ASSERT_TRUE(dir.isValid());
  const QString out = dir.filePath(QStringLiteral("report"));
  auto written = window_->exportReportTo(out);
  ASSERT_TRUE(written.ok()) << written.error().message;
  for (const char* stem : {"overview", "layer_step", "canvas_spread", "text_diff", "routing"}) {
    const QString png = QDir(out).filePath(QString::fromLatin1(stem) + QStringLiteral(".png"));
    ASSERT_TRUE(written.value().contains(png)) << stem;
    QImage image(png);
    ASSERT_FALSE(image.isNull()) << stem;
    EXPECT_EQ(image.size(), reportSize()) << stem;
    // Not blank: a page has more than a handful of colours.
    QSet<QRgb> colours;
    for (int y = 0; y < image.height(); y += 7) {
      for (int x = 0; x < image.width(); x += 7) {
        colours.insert(image.pixel(x, y));
      }
    }
    EXPECT_GT(colours.size(), 3) << stem;
  }
  QFile json_file(QDir(out).filePath(QStringLiteral("summary.json")));
  ASSERT_TRUE(json_file.open(QIODevice::ReadOnly));
  const auto summary = nlohmann::json::parse(json_file.readAll().toStdString());
  ASSERT_EQ(summary["comparisons"].size(), file.comparisons.size());
  for (std::size_t i = 0; i < file.comparisons.size(); ++i) {
    const auto& c = file.comparisons[i];
    EXPECT_EQ(summary["comparisons"][i]["id"], c.id);
    EXPECT_EQ(summary["comparisons"][i]["tokens_changed"], c.tokens_changed);
    EXPECT_EQ(summary["comparisons"][i]["first_divergence"].is_null(), !c.first.found());
  }
  EXPECT_EQ(summary["selected_comparison"], window_->state()->comparisonId().toStdString());
  EXPECT_EQ(summary["emulated"], true);
  QFile md_file(QDir(out).filePath(QStringLiteral("summary.md")));
  ASSERT_TRUE(md_file.open(QIODevice::ReadOnly));
  const QString md = QString::fromUtf8(md_file.readAll());
  EXPECT_TRUE(md.contains(QStringLiteral("EMULATED")));
  for (const auto& c : file.comparisons) {
    EXPECT_TRUE(md.contains(QString::fromStdString("`" + c.id + "`"))) << c.id;
  }
  EXPECT_TRUE(md.contains(QStringLiteral("![layer_step](layer_step.png)")));
  // issue #16: ready to paste: the headline, the prompt, caveats and the exact command.
  const auto story = analysis::build_story(file, summary["selected_comparison"].get<std::string>());
  EXPECT_TRUE(md.contains(QString::fromStdString(story.headline()))) << md.toStdString();
  EXPECT_TRUE(md.contains(QStringLiteral("## Prompt")));
  EXPECT_TRUE(md.contains(QStringLiteral("Random weights")));
  EXPECT_TRUE(md.contains(QStringLiteral("One prompt and one sampling seed")));
  EXPECT_TRUE(md.contains(
      QString::fromStdString(experiment::cli_run_command(file.spec, {}, "experiment.h5"))));
  EXPECT_TRUE(md.contains(QStringLiteral("![Growth, onset and changed tokens](figure.png)")));
  EXPECT_FALSE(md.contains(QStringLiteral("layer slot")));
  // The changed-token table is the file's token diff of the selected comparison.
  const auto* shown = file.comparison(summary["selected_comparison"].get<std::string>());
  ASSERT_NE(shown, nullptr);
  const auto* ref = file.run(shown->reference);
  const auto* run = file.run(shown->run);
  QStringList rows;
  for (const auto& e : shown->token_diff) {
    if (e.op != text::TokenEdit::Op::Equal) {
      rows << QStringLiteral("| %1 | ").arg(e.ref_pos >= 0 ? e.ref_pos : e.run_pos);
    }
  }
  // One table row per edit; a replacement is one changed token, so the changed tokens never
  // exceed the edits (issue #34).
  EXPECT_GE(static_cast<std::int64_t>(rows.size()), shown->tokens_changed);
  // issue #34: self-contained: EMULATED in the headline, the culprit and the kernel lines
  // where the file has them, and a word that the PNGs travel beside it.
  EXPECT_TRUE(md.contains(QStringLiteral("**EMULATED"))) << md.toStdString();
  EXPECT_TRUE(md.contains(QStringLiteral("attach the PNG files")));
  EXPECT_EQ(md.contains(QStringLiteral("## Culprit")), file.culprit.has_value());
  EXPECT_EQ(md.contains(QStringLiteral("## Kernels at the first divergence")),
            !analysis::first_divergence_kernels(file, *shown).empty());
  const auto& tokens = summary["changed_tokens"]["tokens"];
  ASSERT_EQ(tokens.size(), static_cast<std::size_t>(rows.size()));
  std::size_t i = 0;
  for (const auto& e : shown->token_diff) {
    if (e.op == text::TokenEdit::Op::Equal) {
      continue;
    }
    EXPECT_EQ(tokens[i]["reference"], e.ref_pos >= 0 ? ref->tokens[e.ref_pos] : -1);
    EXPECT_EQ(tokens[i]["run"], e.run_pos >= 0 ? run->tokens[e.run_pos] : -1);
    if (i < 60) {
      EXPECT_TRUE(md.contains(QStringLiteral("\n") + rows[static_cast<int>(i)])) << i;
    }
    ++i;
  }
  QImage figure(QDir(out).filePath(QStringLiteral("figure.png")));
  EXPECT_EQ(figure.size(), reportSize());
  // No temporary files are left beside the report.
  EXPECT_EQ(QDir(out).entryList(QDir::Files).size(), 8);
}

// The composite figure shows the story's onset tap over the whole grid, titled with the tap,
// whatever tap, metric, scale or zoom the Layer × Step view shows when the report is exported.
TEST_F(ExplorerTest, FigureShowsTheOnsetTapWhateverTheViewShows) {
  open(fixtureFile("issue_workaround"));
  ExplorerState* state = window_->state();
  const auto* c = state->comparison();
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->first.found());
  const std::string onset = c->first.tap;
  const int other = state->tapNames().indexOf(
      QString::fromStdString(onset == "layer.out" ? "logits" : "layer.out"));
  ASSERT_GE(other, 0);
  state->setTap(other);
  state->setMetric(Metric::MaxAbs);
  state->setLogScale(false);
  flushViews();
  HeatmapPlot* shown = window_->layerStep()->plot(Side::Before);
  const QCPRange full = shown->xAxis->range();
  shown->xAxis->scaleRange(0.25, full.center());
  const QCPRange zoomed = shown->xAxis->range();
  QTemporaryDir dir;
  ASSERT_TRUE(dir.isValid());
  const QString out = dir.filePath(QStringLiteral("report"));
  auto written = window_->exportReportTo(out);
  ASSERT_TRUE(written.ok()) << written.error().message;
  QFile json_file(QDir(out).filePath(QStringLiteral("summary.json")));
  ASSERT_TRUE(json_file.open(QIODevice::ReadOnly));
  const auto summary = nlohmann::json::parse(json_file.readAll().toStdString());
  EXPECT_EQ(summary["figure"]["onset_tap"], onset);
  const std::string title = summary["figure"]["heatmap_title"];
  EXPECT_NE(title.find(onset), std::string::npos) << title;
  EXPECT_NE(title.find("share differing (log)"), std::string::npos) << title;
  // The plot it was drawn with: the onset tap's grid, whole, its first divergence framed.
  HeatmapPlot* figure = window_->layerStep()->onsetPlot();
  ASSERT_NE(figure, nullptr);
  EXPECT_FALSE(figure->isVisible());
  EXPECT_EQ(figure->title().toStdString(), title);
  EXPECT_EQ(figure->columns(), state->ticks());
  EXPECT_DOUBLE_EQ(figure->xAxis->range().size(), full.size());
  EXPECT_EQ(figure->selectedColumn(), c->first.tick);
  const int onset_tap = tapIndex(*state->result(), onset.c_str());
  const int row = state->tapIsPerLayer(onset_tap) ? c->first.layer : 0;
  EXPECT_EQ(figure->value(c->first.tick, row),
            cellValue(*c, Metric::FracDiffer, c->first.tick,
                      c->first.layer >= 0 ? c->first.layer : state->layers(), onset_tap));
  // The user's view is untouched: tap, metric, scale and zoom as they were.
  EXPECT_EQ(state->tap(), other);
  EXPECT_EQ(state->metric(), Metric::MaxAbs);
  EXPECT_FALSE(state->logScale());
  EXPECT_DOUBLE_EQ(shown->xAxis->range().size(), zoomed.size());
}

// The Overview computes a comparison's story and growth once per result: selection changes and
// coming back to a comparison reuse them; a new result computes them again.
TEST_F(ExplorerTest, OverviewComputesEachStoryOncePerResult) {
  const std::string path = fixtureFile("issue_workaround");
  open(path);
  ExplorerState* state = window_->state();
  OverviewView* overview = window_->overview();
  const QString first = state->comparisonId();
  const analysis::Story* story = &overview->story();
  const std::string headline = story->headline();
  ASSERT_FALSE(headline.empty());
  const int computed = overview->storyCache().computed();
  EXPECT_GT(computed, 0);
  // Selection changes: nothing computed again, the same story object.
  for (int tick = 0; tick < std::min(state->ticks(), 5); ++tick) {
    state->setCell(tick, state->layerSlot());
    state->setPosition(tick);
    flushViews();
  }
  EXPECT_EQ(overview->storyCache().computed(), computed);
  EXPECT_EQ(&overview->story(), story);
  // Another comparison: its story once; back to the first: the same object as before.
  QString second;
  for (const auto& c : state->result()->comparisons) {
    if (QString::fromStdString(c.id) != first && c.kind == experiment::ComparisonKind::Row0) {
      second = QString::fromStdString(c.id);
      break;
    }
  }
  ASSERT_FALSE(second.isEmpty());
  state->setComparison(second);
  flushViews();
  const int with_second = overview->storyCache().computed();
  EXPECT_GT(with_second, computed);
  EXPECT_EQ(overview->story().comparison, second.toStdString());
  state->setComparison(first);
  flushViews();
  EXPECT_EQ(overview->storyCache().computed(), with_second);
  EXPECT_EQ(&overview->story(), story);
  EXPECT_EQ(overview->story().headline(), headline);
  // A new result (the same file read again) computes its stories anew.
  open(path);
  EXPECT_EQ(state->comparisonId(), first);
  EXPECT_GT(overview->storyCache().computed(), with_second);
  EXPECT_EQ(overview->story().headline(), headline);
  EXPECT_EQ(overview->story().headline(),
            analysis::build_story(*state->result(), first.toStdString()).headline());
}

TEST_F(ExplorerTest, DamagedFileShowsAnErrorAndTheWindowSurvives) {
  const std::string good = fixtureFile("");
  open(good);
  const auto* shown_before = window_->state()->result();
  // A copy with its second half overwritten, and a text file.
  const std::string damaged = ::testing::TempDir() + "/bl_ui_damaged.h5";
  {
    std::ifstream in(good, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (std::size_t i = bytes.size() / 2; i < bytes.size(); ++i) {
      bytes[i] = static_cast<char>(0x5a);
    }
    std::ofstream(damaged, std::ios::binary) << bytes;
  }
  const std::string text = ::testing::TempDir() + "/bl_ui_text.h5";
  std::ofstream(text) << "not an experiment\n";
  for (const std::string& bad : {damaged, text, std::string("/nonexistent/x.h5")}) {
    QSignalSpy error(window_.get(), &MainWindow::errorShown);
    window_->openFile(QString::fromStdString(bad));
    ASSERT_TRUE(error.wait(kWaitMs)) << bad;
    EXPECT_FALSE(window_->lastError().isEmpty());
    auto* box = window_->findChild<QMessageBox*>(QStringLiteral("ErrorDialog"));
    ASSERT_NE(box, nullptr);
    EXPECT_TRUE(box->isVisible());
    box->close();
    QCoreApplication::sendPostedEvents(nullptr, QEvent::DeferredDelete);
    // The shown experiment is untouched and the window still works.
    EXPECT_EQ(window_->state()->result(), shown_before);
    EXPECT_TRUE(window_->isVisible());
  }
  open(good);
  EXPECT_NE(window_->state()->result(), nullptr);
}

// A bad file when nothing is shown yet (as given on the command line): the error, and the
// embedded sample instead of an empty window (issue #34).
TEST_F(ExplorerTest, ABadFirstFileOpensTheEmbeddedSampleBesideTheError) {
  ASSERT_EQ(window_->state()->result(), nullptr);
  QSignalSpy error(window_.get(), &MainWindow::errorShown);
  QSignalSpy shown(window_.get(), &MainWindow::documentShown);
  window_->openFile(QStringLiteral("/nonexistent/first.h5"));
  ASSERT_TRUE(error.wait(kWaitMs));
  ASSERT_TRUE(shown.count() > 0 || shown.wait(kWaitMs)) << window_->lastError().toStdString();
  ASSERT_NE(window_->state()->result(), nullptr);
  EXPECT_EQ(window_->state()->result()->spec.model.preset, "mid");
  auto* box = window_->findChild<QMessageBox*>(QStringLiteral("ErrorDialog"));
  ASSERT_NE(box, nullptr);
  EXPECT_TRUE(box->text().contains(QStringLiteral("first.h5")) ||
              box->informativeText().contains(QStringLiteral("first.h5")) ||
              box->windowTitle().contains(QStringLiteral("first.h5")));
}

TEST_F(ExplorerTest, DroppingAFileOpensIt) {
  const QString path = QString::fromStdString(fixtureFile(""));
  QMimeData mime;
  mime.setUrls({QUrl::fromLocalFile(path)});
  QDragEnterEvent enter(QPoint(10, 10), Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
  QCoreApplication::sendEvent(window_.get(), &enter);
  EXPECT_TRUE(enter.isAccepted());
  QSignalSpy shown(window_.get(), &MainWindow::documentShown);
  QDropEvent drop(QPointF(10, 10), Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
  QCoreApplication::sendEvent(window_.get(), &drop);
  ASSERT_TRUE(shown.wait(kWaitMs));
  EXPECT_EQ(window_->state()->document().path, QFileInfo(path).absoluteFilePath());
  // Other files are refused at the door.
  QMimeData text;
  text.setUrls({QUrl::fromLocalFile(QStringLiteral("/tmp/notes.txt"))});
  QDragEnterEvent refused(QPoint(10, 10), Qt::CopyAction, &text, Qt::LeftButton, Qt::NoModifier);
  refused.setAccepted(false);
  QCoreApplication::sendEvent(window_.get(), &refused);
  EXPECT_FALSE(refused.isAccepted());
}

TEST_F(ExplorerTest, ABadCheckpointDirectoryFailsWithADialog) {
  RunPanel* panel = window_->runPanel();
  panel->presetCombo()->setCurrentIndex(panel->presetCombo()->count() - 1);
  panel->findChild<QLineEdit*>(QStringLiteral("CheckpointEdit"))
      ->setText(QStringLiteral("/nonexistent/checkpoint"));
  QSignalSpy error(window_.get(), &MainWindow::errorShown);
  panel->runButton()->click();
  ASSERT_TRUE(error.wait(kWaitMs));
  EXPECT_TRUE(window_->lastError().contains(QStringLiteral("/nonexistent/checkpoint")))
      << window_->lastError().toStdString();
  EXPECT_FALSE(window_->runController()->isRunning());
  EXPECT_TRUE(panel->runButton()->isEnabled());
  EXPECT_NE(window_->findChild<QMessageBox*>(QStringLiteral("ErrorDialog")), nullptr);
}

TEST_F(ExplorerTest, EmbeddedSampleOpensWithGpuProvenance) {
  QSignalSpy shown(window_.get(), &MainWindow::documentShown);
  window_->openEmbeddedSample();
  ASSERT_TRUE(shown.wait(kWaitMs)) << window_->lastError().toStdString();
  flushViews();
  const auto* r = window_->state()->result();
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->spec.model.preset, "mid");
  EXPECT_FALSE(r->provenance.emulated);
  EXPECT_EQ(r->provenance.device.rfind("cuda", 0), 0U) << r->provenance.device;
  const QString details = window_->overview()->detailsHtml();
  EXPECT_TRUE(details.contains(QString::fromStdString(r->provenance.device_name)));
  EXPECT_TRUE(details.contains(QStringLiteral("Recorded on a GPU")));
  EXPECT_TRUE(window_->windowTitle().contains(QStringLiteral("embedded sample")));
}

// issue #16: the 26B-A4B lockstep sample from the H200 is bundled beside the mid one; its
// headline tells the GPU's story (selfcond matmul at step 2, no token changed in lockstep,
// the workaround identical).
TEST_F(ExplorerTest, EmbeddedLockstepSampleOf26bTellsItsStory) {
  const auto samples = FileController::embeddedSamples();
  // mid, 26B-A4B lockstep, the 26B-A4B sweep (issue #19), its mixed-batch sweep (#35), the CPU
  // demo-trained one (#33)
  ASSERT_EQ(samples.size(), 5);
  EXPECT_TRUE(samples[2].first.endsWith(QStringLiteral("sweep.h5")));
  EXPECT_TRUE(samples[3].first.endsWith(QStringLiteral("mixed-sweep.h5")));
  QSignalSpy shown(window_.get(), &MainWindow::documentShown);
  // Another op list in the panel before the sample loads.
  ops::FamilySet lm_head;
  lm_head.set(static_cast<std::size_t>(ops::OpFamily::LmHead));
  window_->runPanel()->showWorkaroundPolicy(ops::OpPolicy::row_wise(lm_head));
  window_->openFile(samples[1].first);
  // issue #34: a busy bar while it loads (seconds), the previous experiment greyed out.
  EXPECT_TRUE(window_->loadingIndicator()->isVisibleTo(window_.get()));
  EXPECT_FALSE(window_->tabs()->isEnabled());
  ASSERT_TRUE(shown.wait(kWaitMs)) << window_->lastError().toStdString();
  EXPECT_FALSE(window_->loadingIndicator()->isVisibleTo(window_.get()));
  EXPECT_TRUE(window_->tabs()->isEnabled());
  flushViews();
  const auto* r = window_->state()->result();
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->spec.model.preset, "26b-a4b");
  EXPECT_EQ(r->spec.mode, experiment::RunMode::Lockstep);
  EXPECT_EQ(r->layers, 30);
  EXPECT_EQ(r->provenance.device.rfind("cuda", 0), 0U);
  // issue #34: "Apply workaround" ticks with the file's own op list beside it.
  ASSERT_TRUE(r->spec.workaround.has_value());
  EXPECT_TRUE(window_->runPanel()->workaroundEnabled());
  EXPECT_EQ(ops::describe(window_->runPanel()->workaroundPolicy()),
            ops::describe(*r->spec.workaround));
  const QString headline = window_->overview()->headline()->text();
  EXPECT_TRUE(headline.contains(
      QStringLiteral("first differs at canvas 1 · step 2 in the self-conditioning matmul")))
      << headline.toStdString();
  EXPECT_TRUE(headline.contains(QStringLiteral("the text stays identical")));
  EXPECT_TRUE(headline.contains(QStringLiteral("bitwise identical"))) << headline.toStdString();
  // The Layer × Step view opens on the onset: its tap and cell.
  const auto* c = window_->state()->comparison();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(window_->state()->tapNames().value(window_->state()->tap()).toStdString(),
            c->first.tap);
  EXPECT_EQ(window_->state()->tick(), c->first.tick);
}

// issue #33: the CPU sample of the one-click demo (demo-trained, emulated_h200): B=2 and 4
// change words and the stop, the workaround none; it says it is emulated.
TEST_F(ExplorerTest, EmbeddedDemoTrainedSampleChangesWordsAndTheWorkaroundNone) {
  const auto samples = FileController::embeddedSamples();
  ASSERT_EQ(samples.size(), 5);
  QSignalSpy shown(window_.get(), &MainWindow::documentShown);
  window_->openFile(samples[4].first);
  ASSERT_TRUE(shown.wait(kWaitMs)) << window_->lastError().toStdString();
  const auto* r = window_->state()->result();
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->spec.model.preset, "demo-trained");
  EXPECT_EQ(r->provenance.device, "cpu");
  EXPECT_EQ(ops::policy_text(r->spec.policy), "emulated_h200");
  for (const char* id : {"ref__b2", "ref__b4"}) {
    const auto* c = r->comparison(id);
    ASSERT_NE(c, nullptr) << id;
    EXPECT_GT(c->tokens_changed, 0) << id;
    EXPECT_FALSE(c->tokens_identical) << id;
  }
  for (const char* id : {"wa.ref__wa.b2", "wa.ref__wa.b4"}) {
    const auto* c = r->comparison(id);
    ASSERT_NE(c, nullptr) << id;
    EXPECT_TRUE(c->tokens_identical) << id;
    EXPECT_FALSE(c->first.found()) << id;
  }
  // Its text is the trained model's: KJV words, and a sentence, not "the the the" (issue #33).
  const auto* ref = r->run("ref");
  ASSERT_NE(ref, nullptr);
  EXPECT_NE(ref->text.find("heaven"), std::string::npos) << ref->text;
  EXPECT_NE(ref->text.find("And he "), std::string::npos) << ref->text;
  EXPECT_EQ(ref->text.find("the the"), std::string::npos) << ref->text;
  EXPECT_EQ(r->spec.overrides.max_denoising_steps, 32);
  flushViews();
  EXPECT_TRUE(window_->overview()->headline()->text().contains(QStringLiteral("tokens change")))
      << window_->overview()->headline()->text().toStdString();
}

TEST_F(ExplorerTest, SettingsPersistAcrossWindows) {
  RunPanel* panel = window_->runPanel();
  panel->findChild<QLineEdit*>(QStringLiteral("BatchSizesEdit"))->setText(QStringLiteral("3,5"));
  panel->findChild<QSpinBox*>(QStringLiteral("StepsSpin"))->setValue(17);
  window_->close();
  window_ = std::make_unique<MainWindow>(thisMachine());
  auto spec = window_->runPanel()->spec();
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_EQ(spec.value().batch_sizes, (std::vector<std::int64_t>{3, 5}));
  EXPECT_EQ(spec.value().overrides.max_denoising_steps, 17);
}

TEST(FormatDuration, MinutesAndHours) {
  EXPECT_EQ(formatDuration(65).toStdString(), "1:05");
  EXPECT_EQ(formatDuration(7380).toStdString(), "2:03:00");
  EXPECT_EQ(formatDuration(-1).toStdString(), "?");
}

TEST(ExplorerState, CounterpartIds) {
  EXPECT_EQ(ExplorerState::counterpartId(QStringLiteral("ref__b2")).toStdString(), "wa.ref__wa.b2");
  EXPECT_TRUE(ExplorerState::counterpartId(QStringLiteral("wa.ref__wa.b2")).isEmpty());
  EXPECT_TRUE(ExplorerState::counterpartId(QStringLiteral("b4.rows")).isEmpty());
}

}  // namespace
}  // namespace batchlens::ui
