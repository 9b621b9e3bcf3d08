// SPDX-License-Identifier: Apache-2.0
// The run panel and the workaround toggle (issue #16): the one-click demo's defaults and
// estimate, the op list, "Use this experiment's settings", the toggle running only the missing
// runs with the shown experiment's settings, refusing to run a GPU experiment elsewhere,
// Cancel restoring the toggle and the progress bar, the panel in view at 1500×950.
#include "ui/run_panel.h"

#include <filesystem>
#include <map>
#include <set>

#include <QCheckBox>
#include <QComboBox>
#include <QCoreApplication>
#include <QDir>
#include <QLabel>
#include <QMessageBox>
#include <QProgressBar>
#include <QPushButton>
#include <QScrollBar>
#include <QSettings>
#include <QSignalSpy>
#include <QSpinBox>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QTest>
#include <QTextBrowser>
#include <gtest/gtest.h>

#include "core/experiment/command_line.h"
#include "core/experiment/runner.h"
#include "core/generation/generation_config.h"
#include "core/io/experiment_file.h"
#include "ui/controllers.h"
#include "ui/main_window.h"
#include "ui/qcp.h"
#include "ui/views.h"
#include "ui/workaround_flow.h"

#include <unistd.h>

namespace batchlens::ui {
namespace {

namespace fs = std::filesystem;

constexpr int kWaitMs = 120000;

base::SystemInfo cpuMachine() {
  base::SystemInfo s;
  s.libtorch_version = "test";
  s.torch_threads = 2;
  return s;
}

// A small demo experiment: the H200 emulation profile, B=2 and B=4, two canvases of 4 steps.
experiment::ExperimentSpec smallSpec() {
  experiment::ExperimentSpec s;
  s.model.preset = "demo";
  s.seed = 7;
  s.overrides.max_denoising_steps = 4;
  s.overrides.max_new_tokens = 64;
  s.batch_sizes = {2, 4};
  s.policy = ops::OpPolicy::emulation_profile("emulated_h200");
  return s;
}

// The small experiment without the workaround, written once per process.
const std::string& plainFile() {
  static const std::string path = [] {
    const std::string p =
        (fs::path(::testing::TempDir()) / ("bl_run_panel_" + std::to_string(::getpid()) + ".h5"))
            .string();
    auto r = experiment::run_experiment(smallSpec());
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    if (r.ok()) {
      EXPECT_TRUE(io::write_experiment(p, r.value()).ok());
    }
    return p;
  }();
  return path;
}

class RunPanelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    qputenv("XDG_CONFIG_HOME", QDir(QString::fromStdString(::testing::TempDir()))
                                   .filePath(QStringLiteral("bl-run-config-%1").arg(::getpid()))
                                   .toUtf8());
    QCoreApplication::setOrganizationName(QStringLiteral("BatchLensTests"));
    QCoreApplication::setApplicationName(QStringLiteral("run_panel_test"));
    QSettings().clear();
    window_ = std::make_unique<MainWindow>(cpuMachine());
    window_->resize(1500, 950);
    window_->show();
  }
  void TearDown() override { window_.reset(); }

  void open(const std::string& path) {
    QSignalSpy shown(window_.get(), &MainWindow::documentShown);
    window_->openFile(QString::fromStdString(path));
    ASSERT_TRUE(shown.wait(kWaitMs)) << window_->lastError().toStdString();
  }
  void openSample() {
    QSignalSpy shown(window_.get(), &MainWindow::documentShown);
    window_->openEmbeddedSample();
    ASSERT_TRUE(shown.wait(kWaitMs)) << window_->lastError().toStdString();
  }

  std::unique_ptr<MainWindow> window_;
};

TEST_F(RunPanelTest, OneClickDefaultsAreTheH200EmulationDemoWithAnEstimate) {
  RunPanel* panel = window_->runPanel();
  auto spec = panel->spec();
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_EQ(spec.value().model.preset, "demo");
  EXPECT_EQ(spec.value().load.device, "cpu");
  EXPECT_EQ(ops::policy_text(spec.value().policy), "emulated_h200");
  EXPECT_EQ(spec.value().batch_sizes, (std::vector<std::int64_t>{2, 4}));
  EXPECT_EQ(spec.value().repeats, 1);
  EXPECT_EQ(spec.value().overrides.max_new_tokens, 32);  // one canvas
  EXPECT_EQ(to_json(spec.value()), to_json(defaultDemoSpec()));
  // The profile is named as an emulation, with its GPU; each profile has its description.
  const QString note = panel->profileLabel()->text();
  EXPECT_TRUE(note.contains(QStringLiteral("EMULATION"))) << note.toStdString();
  EXPECT_TRUE(note.contains(QStringLiteral("H200"))) << note.toStdString();
  QComboBox* policy = panel->policyCombo();
  for (const auto& profile : ops::emulation_profiles()) {
    const int i = policy->findData(
        QString::fromUtf8(profile.name.data(), static_cast<int>(profile.name.size())));
    ASSERT_GE(i, 0) << profile.name;
    EXPECT_EQ(policy->itemData(i, Qt::ToolTipRole).toString().toStdString(),
              std::string(profile.description));
  }
  // The expected duration is shown before Run, from the step count.
  EXPECT_GT(panel->expectedSeconds(), 0);
  EXPECT_TRUE(panel->expectedLabel()->text().contains(QStringLiteral("about")))
      << panel->expectedLabel()->text().toStdString();
  const double one_click = panel->expectedSeconds();
  panel->findChild<QLineEdit*>(QStringLiteral("BatchSizesEdit"))->setText(QStringLiteral("2,3,4"));
  EXPECT_GT(panel->expectedSeconds(), one_click);
  // A measured run replaces the calibration for this model here.
  experiment::ExperimentResult measured;
  measured.spec = defaultDemoSpec();
  measured.timings.engines_s = 2.0;
  measured.runs.resize(2);
  measured.runs[0].steps = {10};
  measured.runs[1].steps = {10};
  RunPanel::recordMeasuredCost(measured);
  panel->findChild<QLineEdit*>(QStringLiteral("BatchSizesEdit"))->setText(QStringLiteral("2,4"));
  EXPECT_TRUE(panel->expectedLabel()->text().contains(QStringLiteral("100 ms")))
      << panel->expectedLabel()->text().toStdString();
  EXPECT_TRUE(panel->expectedLabel()->text().contains(QStringLiteral("measured here")));
}

TEST_F(RunPanelTest, OpListShowsEveryFamilyItsFullNameAndLastForMinusOne) {
  QTableWidget* ops = window_->runPanel()->workaroundOps();
  ASSERT_EQ(ops->rowCount(), ops::kOpFamilyCount);
  int rows = 0;
  for (int r = 0; r < ops->rowCount(); ++r) {
    rows += ops->rowHeight(r);
    const QString name = ops->item(r, 0)->text();
    // The whole name fits its column (checkbox and margins aside).
    EXPECT_GE(ops->columnWidth(0), ops->fontMetrics().horizontalAdvance(name) + 20)
        << name.toStdString();
    EXPECT_FALSE(ops->item(r, 0)->toolTip().isEmpty());
    auto* last = qobject_cast<QSpinBox*>(ops->cellWidget(r, 2));
    ASSERT_NE(last, nullptr);
    if (last->value() == -1) {
      EXPECT_EQ(last->text().toStdString(), "last");
    }
  }
  EXPECT_GE(ops->viewport()->height(), rows) << "all 14 families in view";
}

TEST_F(RunPanelTest, ProgressAndRunAreInViewAt1500x950) {
  QCoreApplication::processEvents();
  RunPanel* panel = window_->runPanel();
  const QRect window_rect = window_->rect();
  for (QWidget* w :
       std::initializer_list<QWidget*>{panel->progressBar(), panel->runButton(),
                                       panel->cancelButton(), panel->expectedLabel()}) {
    ASSERT_TRUE(w->isVisible()) << w->objectName().toStdString();
    const QRect r(w->mapTo(window_.get(), QPoint(0, 0)), w->size());
    EXPECT_TRUE(window_rect.contains(r)) << w->objectName().toStdString() << " at " << r.y() << "+"
                                         << r.height() << " in " << window_rect.height();
    EXPECT_FALSE(w->visibleRegion().isEmpty()) << w->objectName().toStdString();
  }
}

TEST_F(RunPanelTest, UseThisExperimentsSettingsKeepsNewTokensAndTheDevice) {
  openSample();
  const auto* r = window_->state()->result();
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->provenance.device.rfind("cuda", 0), 0U);
  RunPanel* panel = window_->runPanel();
  panel->setExperiment(*r);
  const auto ran = generation::parse_generation_config(r->generation_config_json, {});
  ASSERT_TRUE(ran.ok());
  EXPECT_EQ(panel->findChild<QSpinBox*>(QStringLiteral("MaxNewTokensSpin"))->value(),
            r->spec.overrides.max_new_tokens.value_or(ran.value().max_new_tokens));
  EXPECT_EQ(
      panel->findChild<QSpinBox*>(QStringLiteral("StepsSpin"))->value(),
      r->spec.overrides.max_denoising_steps.value_or(ran.value().sampler.max_denoising_steps));
  // The GPU is kept and flagged, not replaced by the CPU; Run refuses with the reason.
  EXPECT_EQ(panel->device().toStdString().rfind("cuda", 0), 0U) << panel->device().toStdString();
  EXPECT_FALSE(panel->deviceAvailable());
  auto* note = panel->findChild<QLabel*>(QStringLiteral("DeviceNote"));
  ASSERT_NE(note, nullptr);
  EXPECT_TRUE(note->isVisibleTo(panel));
  EXPECT_TRUE(note->text().contains(QStringLiteral("not available"))) << note->text().toStdString();
  auto spec = panel->spec();
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.error().code, base::ErrorCode::DeviceUnavailable);
  panel->runButton()->click();
  EXPECT_FALSE(window_->runController()->isRunning());

  // A 256-token spec keeps its 256 new tokens.
  experiment::ExperimentResult long_one;
  long_one.spec = smallSpec();
  long_one.spec.overrides.max_new_tokens.reset();
  generation::GenerationConfig config;
  config.max_new_tokens = 256;
  long_one.generation_config_json = generation::to_json(config);
  panel->setExperiment(long_one);
  EXPECT_EQ(panel->findChild<QSpinBox*>(QStringLiteral("MaxNewTokensSpin"))->value(), 256);
  EXPECT_EQ(panel->device().toStdString(), "cpu");
  EXPECT_TRUE(panel->deviceAvailable());
}

TEST_F(RunPanelTest, ToggleRunsOnlyTheMissingRunsWithTheShownSettings) {
  open(plainFile());
  const auto shown = window_->state()->document().result;
  ASSERT_FALSE(shown->spec.workaround.has_value());
  RunPanel* panel = window_->runPanel();
  // The panel says something else entirely: it must not be used.
  panel->findChild<QLineEdit*>(QStringLiteral("BatchSizesEdit"))->setText(QStringLiteral("3"));
  panel->findChild<QSpinBox*>(QStringLiteral("StepsSpin"))->setValue(2);
  QSignalSpy finished(window_->runController(), &RunController::finished);
  base::Progress last;
  QObject::connect(window_->runController(), &RunController::progressChanged, window_.get(),
                   [&last](const base::Progress& p) { last = p; });
  panel->workaroundCheck()->click();
  ASSERT_TRUE(window_->runController()->isRunning());
  EXPECT_TRUE(window_->runController()->workaroundRun());
  experiment::ExperimentSpec expected = shown->spec;
  expected.workaround = ops::OpPolicy::issue_workaround();
  EXPECT_EQ(to_json(window_->runController()->lastSpec()), to_json(expected));
  ASSERT_TRUE(finished.wait(kWaitMs)) << window_->lastError().toStdString();
  const auto* merged = window_->state()->result();
  ASSERT_NE(merged, nullptr);
  EXPECT_EQ(to_json(merged->spec), to_json(expected));
  // The shown runs kept as they were, plus the workaround's reference and batch sizes only.
  std::set<std::string> ids;
  for (const auto& run : merged->runs) {
    ids.insert(run.id);
  }
  EXPECT_EQ(ids, (std::set<std::string>{"ref", "repeat1", "b2", "b4", "wa.ref", "wa.b2", "wa.b4"}));
  for (const auto& run : shown->runs) {
    ASSERT_NE(merged->run(run.id), nullptr) << run.id;
    EXPECT_EQ(merged->run(run.id)->tokens, run.tokens) << run.id;
    EXPECT_EQ(merged->run(run.id)->canvas_in.data, run.canvas_in.data) << run.id;
  }
  // Its progress counted one group: ticks of the workaround's runs only.
  EXPECT_EQ(last.total, static_cast<std::int64_t>(merged->run("wa.ref")->tick_step.size()));
  // The H200 profile's story: the workaround makes B=2 and B=4 identical to B=1.
  for (const auto& c : merged->comparisons) {
    if (c.id.rfind("wa.", 0) == 0) {
      EXPECT_FALSE(c.first.found()) << c.id;
    }
  }
  EXPECT_TRUE(window_->state()->hasAfter());
  EXPECT_TRUE(panel->workaroundCheck()->isChecked());
  EXPECT_TRUE(window_->state()->document().modified);
}

TEST_F(RunPanelTest, CancelRestoresTheToggleAndTheProgressBar) {
  open(plainFile());
  const auto* before = window_->state()->result();
  RunPanel* panel = window_->runPanel();
  QSignalSpy progress(window_->runController(), &RunController::progressChanged);
  QSignalSpy cancelled(window_->runController(), &RunController::cancelled);
  panel->workaroundCheck()->click();
  ASSERT_TRUE(window_->runController()->isRunning());
  // Wait for a step (the bar has a fill), then cancel.
  for (int i = 0; i < 200 && panel->progressBar()->value() == 0; ++i) {
    progress.wait(200);
  }
  panel->cancelButton()->click();
  ASSERT_TRUE(cancelled.wait(kWaitMs));
  EXPECT_FALSE(panel->workaroundCheck()->isChecked());
  EXPECT_FALSE(window_->state()->showWorkaround());
  EXPECT_EQ(panel->progressBar()->value(), 0);
  EXPECT_EQ(panel->progressBar()->minimum(), 0);
  EXPECT_GT(panel->progressBar()->maximum(), 0);
  EXPECT_EQ(panel->progressBar()->format().toStdString(), "idle");
  EXPECT_EQ(window_->state()->result(), before);
  EXPECT_TRUE(panel->runButton()->isEnabled());
}

TEST_F(RunPanelTest, AGpuExperimentIsNeverSilentlyRunOnThisCpu) {
  openSample();
  const auto* r = window_->state()->result();
  ASSERT_NE(r, nullptr);
  ASSERT_FALSE(workaroundBlocker(cpuMachine(), *r).isEmpty());
  RunPanel* panel = window_->runPanel();
  // The sample holds the issue's workaround already: switching it on again runs nothing.
  ASSERT_TRUE(panel->workaroundCheck()->isChecked());
  panel->workaroundCheck()->click();
  panel->workaroundCheck()->click();
  EXPECT_FALSE(window_->runController()->isRunning());
  EXPECT_TRUE(window_->state()->showWorkaround());
  // Another op list needs the H200: refused here, with the choices.
  panel->workaroundCheck()->click();
  panel->setWorkaroundFamily(QStringLiteral("lm_head"), true);
  QSignalSpy offered(window_.get(), &MainWindow::workaroundElsewhereOffered);
  panel->workaroundCheck()->click();
  EXPECT_FALSE(window_->runController()->isRunning());
  ASSERT_EQ(offered.size(), 1);
  const QString command = offered.first().at(0).toString();
  EXPECT_TRUE(command.startsWith(QStringLiteral("batchlens-cli run "))) << command.toStdString();
  EXPECT_TRUE(command.contains(QStringLiteral("--device cuda"))) << command.toStdString();
  EXPECT_TRUE(command.contains(QStringLiteral("--workaround")) &&
              command.contains(QStringLiteral("lm_head")))
      << command.toStdString();
  auto* box = window_->findChild<QMessageBox*>(QStringLiteral("WorkaroundElsewhereDialog"));
  ASSERT_NE(box, nullptr);
  EXPECT_TRUE(box->isVisible());
  EXPECT_EQ(box->detailedText(), command);
  EXPECT_TRUE(box->text().contains(QStringLiteral("H200"))) << box->text().toStdString();
  ASSERT_NE(box->findChild<QPushButton*>(QStringLiteral("RunDemoButton")), nullptr);
  EXPECT_TRUE(box->findChild<QPushButton*>(QStringLiteral("RunDemoButton"))
                  ->text()
                  .contains(QStringLiteral("emulated_h200")));
  // Nothing applied: the toggle is off, the shown experiment unchanged.
  EXPECT_FALSE(panel->workaroundCheck()->isChecked());
  EXPECT_FALSE(window_->state()->showWorkaround());
  box->button(QMessageBox::Cancel)->click();
  QCoreApplication::processEvents();
  EXPECT_FALSE(window_->runController()->isRunning());
  EXPECT_EQ(window_->state()->result(), r);
}

TEST_F(RunPanelTest, RoutingChartsShowOneLayerAndTheLegendLeavesTheDataFree) {
  // The workaround side comes from a merged run of the plain file.
  open(plainFile());
  QSignalSpy finished(window_->runController(), &RunController::finished);
  window_->runPanel()->workaroundCheck()->click();
  ASSERT_TRUE(finished.wait(kWaitMs)) << window_->lastError().toStdString();
  ExplorerState* state = window_->state();
  ASSERT_TRUE(state->hasAfter());
  window_->tabs()->setCurrentIndex(4);
  RoutingView* routing = window_->routing();
  for (const char* tap : {"logits", "router.scores"}) {
    state->setTap(state->tapNames().indexOf(QString::fromLatin1(tap)));
    QCoreApplication::processEvents();
    routing->flush();
    const int layer = routing->detailLayer();
    ASSERT_GE(layer, 0) << tap;
    const QString before = routing->detailTitle(Side::Before);
    const QString after = routing->detailTitle(Side::After);
    EXPECT_EQ(before, after) << tap;
    EXPECT_TRUE(before.startsWith(QStringLiteral("layer %1 ").arg(layer))) << before.toStdString();
  }
  for (Side side : {Side::Before, Side::After}) {
    QCustomPlot* detail = routing->detail(side);
    detail->replot();
    EXPECT_EQ(detail->axisRect()->insetLayout()->elementCount(), 0);
    EXPECT_FALSE(detail->legend->outerRect().intersects(detail->axisRect()->rect()));
  }
}

TEST_F(RunPanelTest, TextDiffAlignsTheCanvasesAndThePanesScrollTogether) {
  open(plainFile());
  QSignalSpy finished(window_->runController(), &RunController::finished);
  window_->runPanel()->workaroundCheck()->click();
  ASSERT_TRUE(finished.wait(kWaitMs)) << window_->lastError().toStdString();
  window_->tabs()->setCurrentIndex(3);
  TextDiffView* view = window_->textDiff();
  view->flush();
  const QString html = view->html(Side::Before);
  // One table: positions, the reference's and the run's tokens in the same columns.
  EXPECT_TRUE(html.contains(QStringLiteral("<table"))) << html.left(400).toStdString();
  EXPECT_TRUE(html.contains(QStringLiteral("<td><b>ref</b></td>")));
  EXPECT_TRUE(html.contains(QStringLiteral("<td><b>run</b></td>")));
  // Breaks between tokens only: a zero-width space, never a plain space inside a token.
  EXPECT_TRUE(html.contains(QChar(0x200B)));
  EXPECT_EQ(view->browser(Side::Before)->wordWrapMode(), QTextOption::WordWrap);
  window_->resize(900, 420);
  QCoreApplication::processEvents();
  QScrollBar* a = view->browser(Side::Before)->verticalScrollBar();
  QScrollBar* b = view->browser(Side::After)->verticalScrollBar();
  ASSERT_GT(a->maximum(), 0);
  a->setValue(a->maximum());
  EXPECT_EQ(b->value(), b->maximum());
  a->setValue(0);
  EXPECT_EQ(b->value(), 0);
}

TEST(SaveDialogDir, StartsBesideTheOpenedFileNeverAtTheRoot) {
  QTemporaryDir doc_dir;
  QTemporaryDir last_dir;
  const QString doc = QDir(doc_dir.path()).filePath(QStringLiteral("x.h5"));
  EXPECT_EQ(saveDialogDir(last_dir.path(), doc), QDir::cleanPath(doc_dir.path()));
  EXPECT_EQ(saveDialogDir(last_dir.path(), QString()), QDir::cleanPath(last_dir.path()));
  EXPECT_NE(saveDialogDir(QStringLiteral("/"), QString()), QStringLiteral("/"));
  EXPECT_NE(saveDialogDir(QString(), QStringLiteral("/x.h5")), QStringLiteral("/"));
}

TEST(ServerCommand, RunsTheShownExperimentWithTheWorkaround) {
  experiment::ExperimentResult r;
  r.spec = smallSpec();
  r.spec.load.device = "cuda:0";
  r.spec.policy = ops::OpPolicy::default_policy();
  r.spec.prompt = "it's a test";
  r.prompt_ids = {2, 105, 9};
  const QString cmd = serverCommand(r, ops::OpPolicy::issue_workaround(), QStringLiteral("h200"));
  EXPECT_EQ(cmd.toStdString(),
            "batchlens-cli run --preset demo --seed 0 --device cuda:0 --dtype bf16 --experts "
            "eager --prompt-ids 2,105,9 --gen-seed 7 --steps 4 --max-new-tokens 64 "
            "--batch-sizes 2,4 --repeats 1 --rng per_row --prefill copied --mode free --policy "
            "default --workaround issue_workaround --out h200-workaround.h5");
  EXPECT_EQ(experiment::shell_quote("it's"), "'it'\\''s'");
  bool exact = false;
  experiment::Provenance p;
  p.device_name = "NVIDIA H100 80GB HBM3";
  EXPECT_EQ(profileStandingFor(p, &exact).name, "emulated_h100_report");
  EXPECT_TRUE(exact);
  p.device_name = "NVIDIA A100";
  EXPECT_EQ(profileStandingFor(p, &exact).name, "emulated_h200");
  EXPECT_FALSE(exact);
}

}  // namespace
}  // namespace batchlens::ui
