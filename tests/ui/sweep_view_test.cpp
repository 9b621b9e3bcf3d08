// SPDX-License-Identifier: Apache-2.0
// The Sweep tab (issue #19) on the offscreen platform: the H200 sweep bundled in the binary, and a
// sweep run here whose items open their kept experiment or are re-run as full experiments.
#include "ui/sweep_view.h"

#include <utility>

#include <QComboBox>
#include <QCoreApplication>
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QGroupBox>
#include <QLabel>
#include <QLineEdit>
#include <QMessageBox>
#include <QPushButton>
#include <QSignalSpy>
#include <QStatusBar>
#include <QTabWidget>
#include <QTableWidget>
#include <QTest>
#include <gtest/gtest.h>

#include "core/analysis/sweep_merge.h"
#include "core/analysis/sweep_records.h"
#include "core/analysis/sweep_spec.h"
#include "core/experiment/runner.h"
#include "core/io/experiment_file.h"
#include "core/io/sweep_file.h"
#include "tests/support/ui_window.h"
#include "ui/controllers.h"
#include "ui/main_window.h"
#include "ui/qcp.h"
#include "ui/run_panel.h"
#include "ui/sweep_dialog.h"
#include "ui/views.h"

#include <unistd.h>

namespace batchlens::ui {
namespace {

using test_support::kWaitMs;

class SweepViewTest : public test_support::WindowTest {
 protected:
  SweepViewTest() : WindowTest("sweep_view_test", QSize(1400, 900)) {}

  // Opens a sweep file and waits for the Sweep tab to show it.
  void openSweep(const QString& path) {
    QSignalSpy shown(window_.get(), &MainWindow::sweepShown);
    window_->openFile(path);
    ASSERT_TRUE(shown.wait(kWaitMs)) << window_->lastError().toStdString();
  }

  // Runs `spec` into `dir` (keeping what `keep` keeps), writes DIR/sweep.h5 and opens it.
  void runAndOpen(const analysis::SweepSpec& spec, const std::filesystem::path& dir,
                  decltype(analysis::SweepRunOptions::keep) keep) {
    std::filesystem::remove_all(dir);
    analysis::SweepRunOptions run;
    run.dir = dir;
    run.keep = std::move(keep);
    const auto session =
        experiment::open_session_for(analysis::item_spec(spec, analysis::sweep_items(spec)[0]));
    ASSERT_TRUE(session.ok()) << session.error().message;
    const auto outcome = analysis::run_sweep(session.value(), spec, run);
    ASSERT_TRUE(outcome.ok()) << outcome.error().message;
    const auto records = analysis::read_sweep_dir(dir);
    ASSERT_TRUE(records.ok());
    ASSERT_TRUE(io::write_sweep_file(
                    dir / "sweep.h5",
                    analysis::shard_records(records.value(), {0, 1}, outcome.value().provenance))
                    .ok());
    openSweep(QString::fromStdString((dir / "sweep.h5").string()));
  }

  // The table row of (item, kernels group, batch size).
  static int rowOf(QTableWidget* t, int item, const QString& group, int b) {
    for (int r = 0; r < t->rowCount(); ++r) {
      if (t->item(r, 0)->data(Qt::UserRole).toInt() == item && t->item(r, 3)->text() == group &&
          t->item(r, 4)->text().toInt() == b) {
        return r;
      }
    }
    return -1;
  }
};

// Before any sweep: no empty axes, a button to the embedded sample; opening it names the sweep
// in the title and status bar while its tab is shown, the experiment again on the other tabs
// (issue #34).
TEST_F(SweepViewTest, TheEmptyTabOffersTheSampleAndTheTitleFollowsTheTab) {
  SweepView* view = window_->sweep();
  window_->tabs()->setCurrentWidget(view);
  QCoreApplication::processEvents();
  auto* sample = view->findChild<QPushButton*>(QStringLiteral("SweepOpenSample"));
  ASSERT_NE(sample, nullptr);
  EXPECT_TRUE(sample->isVisible());
  EXPECT_FALSE(view->sharePlot()->isVisible());
  EXPECT_FALSE(view->items()->isVisible());
  QSignalSpy shown(window_.get(), &MainWindow::sweepShown);
  sample->click();
  ASSERT_TRUE(shown.wait(kWaitMs)) << window_->lastError().toStdString();
  EXPECT_FALSE(sample->isVisible());
  EXPECT_TRUE(view->sharePlot()->isVisible());
  EXPECT_TRUE(window_->windowTitle().contains(QStringLiteral("sweep")))
      << window_->windowTitle().toStdString();
  auto* label = window_->findChild<QLabel*>(QStringLiteral("DocumentLabel"));
  ASSERT_NE(label, nullptr);
  EXPECT_TRUE(label->text().startsWith(QStringLiteral("Sweep "))) << label->text().toStdString();
  EXPECT_TRUE(label->text().contains(QStringLiteral("24 of 24 items")))
      << label->text().toStdString();
  window_->tabs()->setCurrentWidget(window_->overview());
  EXPECT_FALSE(label->text().startsWith(QStringLiteral("Sweep "))) << label->text().toStdString();
}

// The bundled H200 sweep: 24/24 texts changed at B = 2, 3, 4 and 0/24 with the workaround, all
// first diverging at canvas 1 step 2 in the self-conditioning matmul.
TEST_F(SweepViewTest, TheH200SweepShowsItsCountsIntervalsStepsAndFamilies) {
  openSweep(QStringLiteral(":/samples/h200-26b-a4b-sweep.h5"));
  SweepView* view = window_->sweep();
  EXPECT_EQ(window_->tabs()->currentWidget(), view);
  EXPECT_TRUE(view->caption()->text().contains(QStringLiteral("24 items finished of 24")))
      << view->caption()->text().toStdString();
  EXPECT_TRUE(view->caption()->text().contains(QStringLiteral("NVIDIA H200")));
  EXPECT_EQ(view->items()->rowCount(), 24 * 6);
  // Bars: default at 100 %, workaround at 0 %, each with its Wilson interval.
  QCustomPlot* share = view->sharePlot();
  std::vector<QCPBars*> bars;
  for (int i = 0; i < share->plottableCount(); ++i) {
    if (auto* b = qobject_cast<QCPBars*>(share->plottable(i))) {
      bars.push_back(b);
    }
  }
  ASSERT_EQ(bars.size(), 2U);
  ASSERT_EQ(bars[0]->data()->size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(bars[0]->data()->at(i)->value, 100.0);
    EXPECT_DOUBLE_EQ(bars[1]->data()->at(i)->value, 0.0);
  }
  const QString tip = view->shareTooltip(experiment::RunGroup::Main, 2);
  EXPECT_TRUE(tip.contains(QStringLiteral("24 of 24 items"))) << tip.toStdString();
  EXPECT_TRUE(tip.contains(QStringLiteral("86.2–100.0 %"))) << tip.toStdString();
  EXPECT_TRUE(view->shareTooltip(experiment::RunGroup::Workaround, 4)
                  .contains(QStringLiteral("0 of 24 items (0.0 %; 95 % interval 0.0–13.8 %)")));
  // Histogram: one step (c1 s2), three series (B = 2, 3, 4) of 24 items each.
  QCustomPlot* steps = view->stepPlot();
  ASSERT_EQ(steps->plottableCount(), 3);
  for (int i = 0; i < 3; ++i) {
    auto* b = qobject_cast<QCPBars*>(steps->plottable(i));
    ASSERT_NE(b, nullptr);
    ASSERT_EQ(b->data()->size(), 1);
    EXPECT_DOUBLE_EQ(b->data()->at(0)->value, 24.0);
  }
  ASSERT_EQ(view->families()->rowCount(), 1);
  EXPECT_EQ(view->families()->item(0, 0)->text(), QStringLiteral("selfcond_matmul"));
  EXPECT_EQ(view->families()->item(0, 1)->text(), QStringLiteral("24/24"));
  // An item of the embedded sample was not kept: the button offers a re-run.
  view->items()->selectRow(0);
  EXPECT_TRUE(view->findChild<QPushButton*>(QStringLiteral("SweepOpenItem"))
                  ->text()
                  .startsWith(QStringLiteral("Re-run item")));
}

// A sweep run here with item 0's experiment kept: item 0 opens it; item 1 is offered for a re-run
// that runs it as a full experiment with the item's prompt and seed.
// Issue #35: a sweep over companions and rows: the Batch rows box picks the items of one value
// of an axis (or one of each) for the plots and counts; the item table names each item's.
// issue #35: the H100's sweep of the 26B-A4B architecture beside 3 companions (shared positions,
// default and batch-invariant kernels): every text changed in both groups, the first divergence
// in the rotated query of layer 0.
TEST_F(SweepViewTest, TheMixedBatchSweepShowsEveryTextChangedInBothGroups) {
  openSweep(QStringLiteral(":/samples/h100-26b-a4b-mixed-sweep.h5"));
  SweepView* view = window_->sweep();
  ASSERT_NE(view->document().sweep, nullptr);
  const analysis::SweepRecords& records = *view->document().sweep;
  EXPECT_EQ(records.items_done, 24);
  EXPECT_TRUE(records.spec.mixed());
  EXPECT_EQ(records.spec.base.composition.positions, generation::PositionMode::Shared);
  ASSERT_TRUE(records.spec.base.workaround.has_value());
  EXPECT_EQ(ops::policy_text(*records.spec.base.workaround), "batch_invariant");
  EXPECT_TRUE(view->caption()->text().contains(QStringLiteral("NVIDIA H100")))
      << view->caption()->text().toStdString();
  ASSERT_EQ(records.rows.size(), 48U);
  for (const analysis::SweepRow& r : records.rows) {
    EXPECT_TRUE(r.text_changed) << r.item;
    EXPECT_EQ(r.first_tap, "attn.q") << r.item;
    EXPECT_EQ(r.first_layer, 0) << r.item;
  }
}

TEST_F(SweepViewTest, TheBatchRowsPickTheItemsOfOneValueOfAnAxis) {
  analysis::SweepSpec spec;
  spec.base.model.preset = "tiny";
  spec.base.overrides.max_denoising_steps = 2;
  spec.base.overrides.max_new_tokens = 16;
  spec.base.batch_sizes = {2};
  spec.prompts = {{"Tides?", true, {}}};
  spec.companion_sets = {{}, {{"Explain how a lighthouse works, at length.", true, {}}}};
  spec.rows = {0, 1};
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                                    ("bl_ui_sweep_axes_" + std::to_string(::getpid()));
  runAndOpen(spec, dir, {});
  SweepView* view = window_->sweep();
  QComboBox* box = view->batchRows();
  EXPECT_TRUE(box->isVisibleTo(view));
  ASSERT_EQ(box->count(), 9);  // every item, 2 sets, 2 rows, 4 of each
  EXPECT_TRUE(
      view->shareTooltip(experiment::RunGroup::Main, 2).contains(QStringLiteral("of 4 items")))
      << view->shareTooltip(experiment::RunGroup::Main, 2).toStdString();
  box->setCurrentIndex(box->findData(QStringLiteral("1,-1")));
  EXPECT_TRUE(box->currentText().contains(QStringLiteral("companions 2 (1 prompt)")))
      << box->currentText().toStdString();
  EXPECT_TRUE(
      view->shareTooltip(experiment::RunGroup::Main, 2).contains(QStringLiteral("of 2 items")))
      << view->shareTooltip(experiment::RunGroup::Main, 2).toStdString();
  box->setCurrentIndex(box->findData(QStringLiteral("1,1")));
  EXPECT_TRUE(
      view->shareTooltip(experiment::RunGroup::Main, 2).contains(QStringLiteral("of 1 items")))
      << view->shareTooltip(experiment::RunGroup::Main, 2).toStdString();
  ASSERT_EQ(view->items()->rowCount(), 4);
  ASSERT_EQ(view->items()->columnCount(), 14);
  EXPECT_TRUE(view->items()->item(0, 13)->text().contains(QStringLiteral("prompt in row")));
  // A sweep without the axes: no box.
  openSweep(QStringLiteral(":/samples/h200-26b-a4b-sweep.h5"));
  EXPECT_FALSE(view->batchRows()->isVisibleTo(view));
  std::filesystem::remove_all(dir);
}

TEST_F(SweepViewTest, ItemsOpenTheirKeptExperimentOrRunAgain) {
  analysis::SweepSpec spec;
  spec.base.model.preset = "tiny";
  spec.base.overrides.max_denoising_steps = 3;
  spec.base.overrides.max_new_tokens = 16;
  spec.base.batch_sizes = {2};
  spec.base.policy = ops::OpPolicy::emulation_profile("emulated_h200");
  spec.prompts = {{"Write about Lisbon.", true, {}}, {"Explain tides.", true, {}}};
  spec.seeds = {3};
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("bl_ui_sweep_" + std::to_string(::getpid()));
  runAndOpen(spec, dir,
             [&](const analysis::SweepItem& item, const experiment::ExperimentResult& r) {
               std::filesystem::create_directories(dir / "experiments");
               return item.index == 0 ? io::write_experiment(analysis::kept_experiment(dir, 0), r)
                                      : base::ok_result();
             });
  SweepView* view = window_->sweep();
  ASSERT_EQ(view->items()->rowCount(), 2);
  EXPECT_FALSE(view->keptExperiment(0).isEmpty());
  EXPECT_TRUE(view->keptExperiment(1).isEmpty());

  // Item 0: its kept experiment opens in the explorer.
  {
    QSignalSpy shown(window_.get(), &MainWindow::documentShown);
    const int row = rowOf(view->items(), 0, QStringLiteral("default"), 2);
    ASSERT_GE(row, 0);
    view->items()->selectRow(row);
    view->findChild<QPushButton*>(QStringLiteral("SweepOpenItem"))->click();
    ASSERT_TRUE(shown.wait(kWaitMs)) << window_->lastError().toStdString();
    EXPECT_EQ(window_->state()->document().path, view->keptExperiment(0));
  }
  // Item 1: offered, then run as a full experiment (kernel provenance included).
  {
    window_->tabs()->setCurrentWidget(view);
    QSignalSpy finished(window_->runController(), &RunController::finished);
    Q_EMIT view->itemActivated(1);
    auto* box = window_->findChild<QMessageBox*>(QStringLiteral("SweepItemOffer"));
    ASSERT_NE(box, nullptr);
    EXPECT_TRUE(box->isVisible());
    for (QAbstractButton* b : box->buttons()) {
      if (box->buttonRole(b) == QMessageBox::AcceptRole) {
        b->click();
      }
    }
    ASSERT_TRUE(finished.wait(kWaitMs)) << window_->lastError().toStdString();
    QCoreApplication::processEvents();
    const auto* r = window_->state()->result();
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->spec.prompt, "Explain tides.");
    EXPECT_EQ(r->spec.seed, 3U);
    EXPECT_TRUE(r->kernels.has_value());
  }
  std::filesystem::remove_all(dir);
}

// Run > Run sweep… (issue #36): the dialog checks its fields as they are typed, runs the Run
// panel's experiment over a prompts file × seeds here with progress, and the sweep opens in the
// Sweep tab; the same sweep again skips every item; Slurm is offered only for an SSH target.
TEST_F(SweepViewTest, ASweepFromTheDialogRunsHereAndOpensInTheSweepTab) {
  const QString dir = QDir::temp().filePath(
      QStringLiteral("bl_gui_sweep_%1").arg(QCoreApplication::applicationPid()));
  QDir(dir).removeRecursively();
  ASSERT_TRUE(QDir().mkpath(dir));
  window_->runController()->setSweepsDir(dir + QStringLiteral("/sweeps"));
  const QString prompts = dir + QStringLiteral("/prompts.txt");
  {
    QFile f(prompts);
    ASSERT_TRUE(f.open(QIODevice::WriteOnly));
    f.write("Tides?\nWhy is the sky blue?\n");
  }
  experiment::ExperimentSpec spec;
  spec.model.preset = "tiny";
  spec.batch_sizes = {2};
  spec.repeats = 0;
  spec.overrides.max_denoising_steps = 2;
  spec.overrides.max_new_tokens = 16;
  spec.policy = ops::OpPolicy::emulation_profile("emulated_h200");
  window_->runPanel()->setSpec(spec);

  SweepDialog* dialog = window_->chooseSweep();
  ASSERT_NE(dialog, nullptr);
  EXPECT_FALSE(dialog->slurmBox()->isEnabled()) << "Slurm is for SSH targets";
  dialog->seedsEdit()->setText(QStringLiteral("1-x"));
  dialog->refresh();
  EXPECT_FALSE(dialog->runButton()->isEnabled());
  EXPECT_TRUE(dialog->summaryLabel()->text().contains(QStringLiteral("seeds: 'x' is not a number")))
      << dialog->summaryLabel()->text().toStdString();
  dialog->promptsEdit()->setText(dir + QStringLiteral("/missing.txt"));
  dialog->seedsEdit()->setText(QStringLiteral("0-1"));
  dialog->refresh();
  EXPECT_FALSE(dialog->runButton()->isEnabled());
  EXPECT_TRUE(dialog->summaryLabel()->text().contains(QStringLiteral("missing.txt")))
      << dialog->summaryLabel()->text().toStdString();
  dialog->promptsEdit()->setText(prompts);
  dialog->refresh();
  ASSERT_TRUE(dialog->runButton()->isEnabled()) << dialog->summaryLabel()->text().toStdString();
  EXPECT_TRUE(dialog->summaryLabel()->text().startsWith(QStringLiteral("4 item(s): 2 prompt(s)")))
      << dialog->summaryLabel()->text().toStdString();

  QSignalSpy shown(window_.get(), &MainWindow::sweepShown);
  QSignalSpy progress(window_->runController(), &RunController::progressChanged);
  dialog->runButton()->click();
  EXPECT_TRUE(window_->runController()->isRunning());
  ASSERT_TRUE(shown.wait(kWaitMs)) << window_->lastError().toStdString();
  EXPECT_GT(progress.size(), 0);
  EXPECT_EQ(window_->tabs()->currentWidget(), window_->sweep());
  const SweepDocument& doc = window_->sweep()->document();
  ASSERT_NE(doc.sweep, nullptr);
  EXPECT_EQ(doc.sweep->items_done, 4);
  EXPECT_TRUE(doc.path.startsWith(dir + QStringLiteral("/sweeps/sweep-")))
      << doc.path.toStdString();
  EXPECT_TRUE(window_->runPanel()->message().contains(QStringLiteral("4 item(s) run")))
      << window_->runPanel()->message().toStdString();

  // The same sweep again: its folder's items are kept, nothing runs twice.
  dialog = window_->chooseSweep();
  ASSERT_NE(dialog, nullptr);
  dialog->promptsEdit()->setText(prompts);
  dialog->seedsEdit()->setText(QStringLiteral("0-1"));
  dialog->refresh();
  dialog->runButton()->click();
  ASSERT_TRUE(shown.wait(kWaitMs)) << window_->lastError().toStdString();
  EXPECT_TRUE(window_->runPanel()->message().contains(QStringLiteral("0 item(s) run, 4")))
      << window_->runPanel()->message().toStdString();

  // A sweep whose model cannot load fails in words that name the sweep.
  analysis::SweepInput in;
  in.base = spec;
  in.base.model.preset.clear();
  in.base.model.checkpoint_dir = (dir + QStringLiteral("/no-such-checkpoint")).toStdString();
  in.prompts_file = prompts.toStdString();
  const auto bad = analysis::sweep_from_input(in);
  ASSERT_TRUE(bad.ok()) << bad.error().message;
  QSignalSpy errors(window_.get(), &MainWindow::errorShown);
  window_->runSweep(bad.value());
  ASSERT_TRUE(errors.wait(kWaitMs));
  EXPECT_TRUE(window_->statusBar()->currentMessage().contains(QStringLiteral("sweep")))
      << window_->statusBar()->currentMessage().toStdString();
  EXPECT_TRUE(window_->lastError().contains(QStringLiteral("no-such-checkpoint")))
      << window_->lastError().toStdString();
  QDir(dir).removeRecursively();
}

}  // namespace
}  // namespace batchlens::ui
