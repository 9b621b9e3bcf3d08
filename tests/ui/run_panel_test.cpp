// SPDX-License-Identifier: Apache-2.0
// The run panel and the workaround toggle (issue #16): the one-click demo's defaults and
// estimate, the op list, "Use this experiment's settings", the toggle running only the missing
// runs with the shown experiment's settings, refusing to run a GPU experiment elsewhere,
// Cancel restoring the toggle and the progress bar, the panel in view at 1500×950.
#include "ui/run_panel.h"

#include <set>

#include <QApplication>
#include <QCheckBox>
#include <QComboBox>
#include <QCoreApplication>
#include <QDateTime>
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QLabel>
#include <QLineEdit>
#include <QMessageBox>
#include <QPlainTextEdit>
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
#include <QTextDocument>
#include <QWheelEvent>
#include <gtest/gtest.h>

#include "core/experiment/command_line.h"
#include "core/experiment/runner.h"
#include "core/generation/generation_config.h"
#include "core/io/experiment_file.h"
#include "core/model/config.h"
#include "core/setup/front_door.h"
#include "tests/support/ui_window.h"
#include "ui/app_filter.h"
#include "ui/controllers.h"
#include "ui/main_window.h"
#include "ui/qcp.h"
#include "ui/views.h"
#include "ui/workaround_flow.h"

namespace batchlens::ui {
namespace {

using test_support::kWaitMs;
using test_support::thisMachine;

// A small demo experiment: the H200 emulation profile, B=2 and B=4, two canvases of 4 steps.
experiment::ExperimentSpec smallSpec() {
  return test_support::smallDemoSpec(7, 4, ops::OpPolicy::emulation_profile("emulated_h200"));
}

// The small experiment without the workaround, written once per process.
const std::string& plainFile() {
  return test_support::experimentFile("run_panel", smallSpec());
}

class RunPanelTest : public test_support::WindowTest {
 protected:
  RunPanelTest() : WindowTest("run_panel_test", QSize(1500, 950)) {}
};

TEST_F(RunPanelTest, OneClickDefaultsAreTheH200EmulationDemoWithAnEstimate) {
  RunPanel* panel = window_->runPanel();
  auto spec = panel->spec();
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  // issue #33: the bundled trained model, with a verse as the prompt.
  EXPECT_EQ(spec.value().model.preset, "demo-trained");
  EXPECT_EQ(spec.value().prompt, "In the beginning God created the heaven and the earth.");
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
  measured.timings.load_s = 1.0;
  measured.timings.kernels_s = 3.0;
  measured.runs.resize(2);
  measured.runs[0].steps = {10};
  measured.runs[1].steps = {10};
  RunPanel::recordMeasuredCost(measured);
  panel->findChild<QLineEdit*>(QStringLiteral("BatchSizesEdit"))->setText(QStringLiteral("2,4"));
  EXPECT_TRUE(panel->expectedLabel()->text().contains(QStringLiteral("100 ms")))
      << panel->expectedLabel()->text().toStdString();
  EXPECT_TRUE(panel->expectedLabel()->text().contains(QStringLiteral("measured on this machine")));
  // issue #34: the estimate includes building the model and recording its kernels.
  EXPECT_TRUE(panel->expectedLabel()->text().contains(QStringLiteral("record its kernels")))
      << panel->expectedLabel()->text().toStdString();
  EXPECT_GE(panel->expectedSeconds(), 1.0 + 3.0 + 0.1);
}

TEST_F(RunPanelTest, TheToggleAddsTheWorkaroundAndBadInputIsRefused) {
  RunPanel* panel = window_->runPanel();
  ASSERT_FALSE(panel->spec().value().workaround.has_value());  // the defaults: above
  panel->setWorkaroundEnabled(true);
  EXPECT_EQ(panel->spec().value().workaround, ops::OpPolicy::issue_workaround());
  panel->findChild<QLineEdit*>(QStringLiteral("BatchSizesEdit"))->setText(QStringLiteral("2,x"));
  auto bad = panel->spec();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("'x'"), std::string::npos);
  // Run with a bad spec: a message, no run.
  panel->runButton()->click();
  EXPECT_FALSE(window_->runController()->isRunning());
  EXPECT_TRUE(panel->findChild<QLabel*>(QStringLiteral("RunStatus"))
                  ->text()
                  .contains(QStringLiteral("Cannot run")));
}

// issue #35: a companions file makes every batch a mixed one (batched prefill, positions
// chosen); a bad file is refused with its reason and leaves identical rows.
TEST_F(RunPanelTest, CompanionsFileMakesMixedBatchesAndABadOneIsRefused) {
  RunPanel* panel = window_->runPanel();
  auto* edit = panel->findChild<QLineEdit*>(QStringLiteral("CompanionsEdit"));
  auto* note = panel->findChild<QLabel*>(QStringLiteral("CompanionsNote"));
  auto* positions = panel->findChild<QComboBox*>(QStringLiteral("PositionsCombo"));
  ASSERT_NE(edit, nullptr);
  ASSERT_NE(note, nullptr);
  ASSERT_NE(positions, nullptr);
  EXPECT_FALSE(positions->isEnabled());
  const QString dir = QDir::tempPath() + QStringLiteral("/bl_companions_ui_") +
                      QString::number(QCoreApplication::applicationPid());
  QDir().mkpath(dir);
  {
    QFile good(dir + QStringLiteral("/good.txt"));
    ASSERT_TRUE(good.open(QIODevice::WriteOnly));
    good.write("Explain tides.\nWrite a long essay about Portugal.\n");
  }
  edit->setText(dir + QStringLiteral("/good.txt"));
  Q_EMIT edit->editingFinished();
  positions->setCurrentText(QStringLiteral("per_row"));
  panel->findChild<QSpinBox*>(QStringLiteral("RowSpin"))->setValue(1);
  auto spec = panel->spec();
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_EQ(spec.value().composition.companions.size(), 2U);
  EXPECT_EQ(spec.value().composition.companions[0].text, "Explain tides.");
  EXPECT_EQ(spec.value().composition.row, 1);
  EXPECT_EQ(spec.value().composition.positions, generation::PositionMode::PerRow);
  EXPECT_EQ(spec.value().prefill, generation::PrefillMode::Batched);
  EXPECT_TRUE(note->text().contains(QStringLiteral("2 companion")));
  {
    QFile bad(dir + QStringLiteral("/bad.txt"));
    ASSERT_TRUE(bad.open(QIODevice::WriteOnly));
    bad.write("fine\ncaf\xC3 broken\n");
  }
  edit->setText(dir + QStringLiteral("/bad.txt"));
  Q_EMIT edit->editingFinished();
  EXPECT_TRUE(note->text().contains(QStringLiteral("not valid UTF-8")))
      << note->text().toStdString();
  panel->findChild<QSpinBox*>(QStringLiteral("RowSpin"))->setValue(0);
  spec = panel->spec();
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_FALSE(spec.value().composition.mixed());
  QDir(dir).removeRecursively();
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

// One wheel notch over the widget, as the mouse sends it (through the application's filters).
void wheelOver(QWidget* w, int notches) {
  const QPointF at(w->width() / 2.0, w->height() / 2.0);
  QWheelEvent wheel(at, w->mapToGlobal(at), QPoint(), QPoint(0, 120 * notches), Qt::NoButton,
                    Qt::NoModifier, Qt::NoScrollPhase, false);
  QApplication::sendEvent(w, &wheel);
}

// Scrolling the Run dock over a spin box or combo box changes nothing (issue #34: New tokens
// went 32 -> 17); once clicked or tabbed into, the wheel changes the value as usual.
TEST_F(RunPanelTest, TheWheelChangesSpinBoxesAndCombosOnlyWhenFocused) {
  RunPanel* panel = window_->runPanel();
  auto* tokens = panel->findChild<QSpinBox*>(QStringLiteral("MaxNewTokensSpin"));
  auto* policy = panel->findChild<QComboBox*>(QStringLiteral("PolicyCombo"));
  ASSERT_NE(tokens, nullptr);
  ASSERT_NE(policy, nullptr);
  window_->activateWindow();
  panel->runButton()->setFocus();
  QCoreApplication::processEvents();
  const int value = tokens->value();
  const int index = policy->currentIndex();
  wheelOver(tokens, -3);
  wheelOver(policy, -1);
  EXPECT_EQ(tokens->value(), value);
  EXPECT_EQ(policy->currentIndex(), index);
  EXPECT_EQ(tokens->focusPolicy(), Qt::StrongFocus);
  tokens->setFocus();
  QCoreApplication::processEvents();
  if (!tokens->hasFocus()) {
    GTEST_SKIP() << "this platform gives no keyboard focus to an offscreen window";
  }
  wheelOver(tokens, 1);
  EXPECT_NE(tokens->value(), value);
}

// Long plain tooltips wrap (as rich text, escaped, line breaks kept); short and rich ones stay
// as they are (issue #34: some ran to 1400 px).
TEST(AppFilter, LongToolTipsWrap) {
  EXPECT_EQ(wrappedToolTip(QStringLiteral("short")), QStringLiteral("short"));
  const QString rich = QStringLiteral("<b>bold</b> ") + QString(200, QLatin1Char('x'));
  EXPECT_EQ(wrappedToolTip(rich), rich);
  const QString plain = QStringLiteral("a < b\n") + QString(100, QLatin1Char('y'));
  const QString wrapped = wrappedToolTip(plain);
  EXPECT_TRUE(Qt::mightBeRichText(wrapped)) << wrapped.toStdString();
  EXPECT_TRUE(wrapped.contains(QStringLiteral("a &lt; b<br>"))) << wrapped.toStdString();
  QLabel label;
  label.setText(wrapped);
  label.setWordWrap(true);
  EXPECT_LT(label.sizeHint().width(), 900);
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

// Closing the window during a run asks first; "Keep running" keeps both, "Stop the run and
// close" stops the run and closes (issue #34).
TEST_F(RunPanelTest, ClosingDuringARunAsksFirst) {
  open(plainFile());
  RunPanel* panel = window_->runPanel();
  QSignalSpy cancelled(window_->runController(), &RunController::cancelled);
  panel->workaroundCheck()->click();
  ASSERT_TRUE(window_->runController()->isRunning());
  EXPECT_FALSE(window_->close());
  auto* box = window_->findChild<QMessageBox*>(QStringLiteral("CloseDuringRunDialog"));
  ASSERT_NE(box, nullptr);
  EXPECT_TRUE(box->isVisible());
  EXPECT_TRUE(window_->isVisible());
  box->findChild<QPushButton*>(QStringLiteral("KeepRunningButton"))->click();
  QCoreApplication::processEvents();
  EXPECT_TRUE(window_->isVisible());
  if (!window_->runController()->isRunning()) {
    GTEST_SKIP() << "the run ended before the second close: nothing left to ask about";
  }
  EXPECT_FALSE(window_->close());
  box = nullptr;
  for (auto* shown : window_->findChildren<QMessageBox*>(QStringLiteral("CloseDuringRunDialog"))) {
    box = shown->isVisible() ? shown : box;
  }
  ASSERT_NE(box, nullptr);
  box->findChild<QPushButton*>(QStringLiteral("StopAndCloseButton"))->click();
  QCoreApplication::processEvents();
  EXPECT_FALSE(window_->isVisible());
  EXPECT_TRUE(cancelled.size() > 0 || cancelled.wait(kWaitMs));
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
  ASSERT_FALSE(workaroundBlocker(thisMachine(), *r).isEmpty());
  RunPanel* panel = window_->runPanel();
  // The sample holds the issue's workaround already: switching it on again runs nothing.
  ASSERT_TRUE(panel->workaroundCheck()->isChecked());
  panel->workaroundCheck()->click();
  panel->workaroundCheck()->click();
  EXPECT_FALSE(window_->runController()->isRunning());
  EXPECT_TRUE(window_->state()->showWorkaround());
  // Another op list needs the GPU: refused here, with the choices.
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
  // The embedded sample is the H100's: the CPU demo offered is the H100 report's emulation.
  EXPECT_TRUE(box->text().contains(QStringLiteral("H100"))) << box->text().toStdString();
  ASSERT_NE(box->findChild<QPushButton*>(QStringLiteral("RunDemoButton")), nullptr);
  EXPECT_TRUE(box->findChild<QPushButton*>(QStringLiteral("RunDemoButton"))
                  ->text()
                  .contains(QStringLiteral("emulated_h100_report")));
  // Nothing applied: the toggle is off, the shown experiment unchanged.
  EXPECT_FALSE(panel->workaroundCheck()->isChecked());
  EXPECT_FALSE(window_->state()->showWorkaround());
  box->button(QMessageBox::Cancel)->click();
  QCoreApplication::processEvents();
  EXPECT_FALSE(window_->runController()->isRunning());
  EXPECT_EQ(window_->state()->result(), r);
}

// A CPU experiment recorded with other CPU kernels (here: ATen's capability) cannot be extended
// here: the toggle refuses and says why, and offers to run the whole experiment again here.
TEST_F(RunPanelTest, AnExperimentOfOtherCpuKernelsIsRefusedAndOfferedToRunHere) {
  experiment::ExperimentResult other = io::read_experiment(plainFile()).value();
  other.provenance.cpu.aten_capability =
      other.provenance.cpu.aten_capability == "AVX512" ? "AVX2" : "AVX512";
  QTemporaryDir dir;
  const std::string path = QDir(dir.path()).filePath(QStringLiteral("other.h5")).toStdString();
  ASSERT_TRUE(io::write_experiment(path, other).ok());
  open(path);
  const auto* r = window_->state()->result();
  ASSERT_NE(r, nullptr);
  const QString blocker = workaroundBlocker(thisMachine(), *r);
  EXPECT_TRUE(blocker.contains(QStringLiteral("ATen CPU kernels"))) << blocker.toStdString();
  EXPECT_TRUE(blocker.contains(QStringLiteral("would not be comparable"))) << blocker.toStdString();
  // The same file as recorded here can be extended.
  EXPECT_TRUE(workaroundBlocker(thisMachine(), io::read_experiment(plainFile()).value()).isEmpty());

  RunPanel* panel = window_->runPanel();
  QSignalSpy offered(window_.get(), &MainWindow::workaroundElsewhereOffered);
  panel->workaroundCheck()->click();
  EXPECT_FALSE(window_->runController()->isRunning());
  ASSERT_EQ(offered.size(), 1);
  EXPECT_FALSE(panel->workaroundCheck()->isChecked());
  auto* box = window_->findChild<QMessageBox*>(QStringLiteral("WorkaroundElsewhereDialog"));
  ASSERT_NE(box, nullptr);
  EXPECT_TRUE(box->text().contains(QStringLiteral("ATen CPU kernels")))
      << box->text().toStdString();
  EXPECT_EQ(box->findChild<QPushButton*>(QStringLiteral("RunDemoButton")), nullptr);
  auto* here = box->findChild<QPushButton*>(QStringLiteral("RunHereButton"));
  ASSERT_NE(here, nullptr);
  // Run it again here: the whole experiment, its settings and prompt ids, with the workaround.
  QSignalSpy cancelled(window_->runController(), &RunController::cancelled);
  here->click();
  ASSERT_TRUE(window_->runController()->isRunning());
  EXPECT_FALSE(window_->runController()->workaroundRun());
  const experiment::ExperimentSpec& spec = window_->runController()->lastSpec();
  EXPECT_EQ(spec.workaround, ops::OpPolicy::issue_workaround());
  EXPECT_EQ(spec.prompt_ids, r->prompt_ids);
  EXPECT_EQ(spec.batch_sizes, r->spec.batch_sizes);
  EXPECT_EQ(spec.seed, r->spec.seed);
  EXPECT_TRUE(panel->workaroundCheck()->isChecked());
  window_->runController()->cancel();
  ASSERT_TRUE(cancelled.wait(kWaitMs));
  EXPECT_FALSE(panel->workaroundCheck()->isChecked()) << "a cancelled run puts the toggle back";
}

// The toggle's run never started (the form is refused): the toggle goes back at once, and a
// later run of the user's, cancelled, leaves the toggle as the user set it.
TEST_F(RunPanelTest, ARunThatNeverStartedLeavesNoRestoreBehind) {
  RunPanel* panel = window_->runPanel();
  auto* sizes = panel->findChild<QLineEdit*>(QStringLiteral("BatchSizesEdit"));
  sizes->setText(QStringLiteral("2,x"));
  panel->workaroundCheck()->click();  // no experiment shown: a run of the form, refused
  EXPECT_FALSE(window_->runController()->isRunning());
  EXPECT_FALSE(panel->workaroundCheck()->isChecked());
  EXPECT_FALSE(window_->state()->showWorkaround());
  EXPECT_TRUE(panel->findChild<QLabel*>(QStringLiteral("RunStatus"))
                  ->text()
                  .contains(QStringLiteral("Cannot run")));
  // The user's own run, with the workaround set in the form, cancelled.
  sizes->setText(QStringLiteral("2,4"));
  panel->findChild<QSpinBox*>(QStringLiteral("StepsSpin"))->setValue(48);
  panel->findChild<QSpinBox*>(QStringLiteral("MaxNewTokensSpin"))->setValue(256);
  panel->setWorkaroundEnabled(true);
  QSignalSpy cancelled(window_->runController(), &RunController::cancelled);
  panel->runButton()->click();
  ASSERT_TRUE(window_->runController()->isRunning());
  panel->cancelButton()->click();
  ASSERT_TRUE(cancelled.wait(kWaitMs));
  EXPECT_TRUE(panel->workaroundCheck()->isChecked()) << "Cancel restored a toggle of a run that "
                                                        "never started";
}

// The estimate reads the checkpoint's config.json once per version of the file (path, size,
// modification time), not per keystroke, and follows the file when it changes.
TEST_F(RunPanelTest, EstimateReadsTheCheckpointConfigOncePerVersion) {
  QTemporaryDir dir;
  ASSERT_TRUE(dir.isValid());
  const QString config = QDir(dir.path()).filePath(QStringLiteral("config.json"));
  nlohmann::json doc = model::to_json(model::load_preset("demo").value());
  const auto write = [&config](const nlohmann::json& d) {
    QFile f(config);
    ASSERT_TRUE(f.open(QIODevice::WriteOnly | QIODevice::Truncate));
    f.write(QByteArray::fromStdString(d.dump(2)));
  };
  doc["canvas_length"] = 32;
  write(doc);
  const QDateTime written = QFileInfo(config).lastModified();
  RunPanel* panel = window_->runPanel();
  panel->presetCombo()->setCurrentIndex(panel->presetCombo()->count() - 1);
  panel->findChild<QLineEdit*>(QStringLiteral("CheckpointEdit"))->setText(dir.path());
  auto* tokens = panel->findChild<QSpinBox*>(QStringLiteral("MaxNewTokensSpin"));
  auto* steps = panel->findChild<QSpinBox*>(QStringLiteral("StepsSpin"));
  tokens->setValue(64);
  steps->setValue(5);
  const auto text = [panel] {
    return panel->expectedLabel()->text().toStdString();
  };
  EXPECT_NE(text().find("× 2 canvas(es) × ≤ 5 steps"), std::string::npos) << text();
  const int reads = panel->modelFileReads();
  // Typing: the estimate follows the form without reading the file again.
  for (int v = 6; v <= 12; ++v) {
    steps->setValue(v);
  }
  panel->findChild<QLineEdit*>(QStringLiteral("BatchSizesEdit"))->setText(QStringLiteral("2,3"));
  EXPECT_NE(text().find("× 2 canvas(es) × ≤ 12 steps"), std::string::npos) << text();
  static_cast<void>(panel->expectedSeconds());  // through the same cache
  EXPECT_EQ(panel->modelFileReads(), reads);
  // The same version (size and time) is not read again; a new one is.
  doc["canvas_length"] = 64;
  write(doc);
  QFile file(config);
  ASSERT_TRUE(file.open(QIODevice::ReadWrite));
  ASSERT_TRUE(file.setFileTime(written, QFileDevice::FileModificationTime));
  file.close();
  steps->setValue(11);
  EXPECT_NE(text().find("× 2 canvas(es)"), std::string::npos) << text();
  EXPECT_EQ(panel->modelFileReads(), reads);
  ASSERT_TRUE(file.open(QIODevice::ReadWrite));
  ASSERT_TRUE(file.setFileTime(written.addSecs(10), QFileDevice::FileModificationTime));
  file.close();
  steps->setValue(12);
  EXPECT_NE(text().find("× 1 canvas(es) × ≤ 12 steps"), std::string::npos) << text();
  EXPECT_EQ(panel->modelFileReads(), reads + 1);
}

// "Use this experiment's settings" runs the experiment's own prompt ids: ids whose decoded text
// tokenises to other ids are kept, not replaced by the text's.
TEST_F(RunPanelTest, UseThisExperimentsSettingsRunsItsPromptIds) {
  auto tokenizer = setup::tokenizer_for(smallSpec().model);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.error().message;
  const text::Tokenizer& t = *tokenizer.value();
  // A sentence spelled one character per token: the same text, other ids than its encoding
  // (the preset's vocabulary holds its words whole).
  const std::string text = "the cat sat on a mat.";
  std::vector<std::int64_t> ids;
  for (const char c : text) {
    const auto one = t.encode(std::string(1, c));
    ASSERT_TRUE(one.ok());
    ids.insert(ids.end(), one.value().begin(), one.value().end());
  }
  ASSERT_EQ(t.decode(ids), text);
  ASSERT_NE(t.encode(t.decode(ids)).value(), ids) << "the ids must not round-trip";
  experiment::ExperimentSpec spec = smallSpec();
  spec.prompt_ids = ids;
  spec.overrides.max_new_tokens = 32;
  spec.batch_sizes = {2};
  auto ran = experiment::run_experiment(spec);
  ASSERT_TRUE(ran.ok()) << ran.error().message;
  ASSERT_EQ(ran.value().prompt_ids, ids);

  RunPanel* panel = window_->runPanel();
  panel->setExperiment(ran.value());
  EXPECT_EQ(panel->spec().value().prompt_ids, ids);
  auto* note = panel->findChild<QLabel*>(QStringLiteral("PromptIdsNote"));
  ASSERT_NE(note, nullptr);
  EXPECT_TRUE(note->isVisibleTo(panel));
  // Editing the prompt tokenises the text; putting it back runs the ids again.
  auto* prompt = panel->findChild<QPlainTextEdit*>(QStringLiteral("PromptEdit"));
  prompt->setPlainText(QString::fromStdString(text + "!"));
  EXPECT_TRUE(panel->spec().value().prompt_ids.empty());
  EXPECT_FALSE(note->isVisibleTo(panel));
  prompt->setPlainText(QString::fromStdString(text));
  EXPECT_EQ(panel->spec().value().prompt_ids, ids);
  // Run: the new experiment's prompt is the ids as they ran.
  QSignalSpy finished(window_->runController(), &RunController::finished);
  window_->runFromPanel();
  ASSERT_TRUE(finished.wait(kWaitMs)) << window_->lastError().toStdString();
  ASSERT_NE(window_->state()->result(), nullptr);
  EXPECT_EQ(window_->state()->result()->prompt_ids, ids);
  // issue #34: "Finished in" is the wall time from Run to the result: at least every timed
  // part of the run (model build and kernel recording included).
  const auto& timing = window_->state()->result()->timings;
  EXPECT_GE(window_->lastRunSeconds() + 0.01, timing.load_s + timing.engines_s +
                                                  timing.comparisons_s + timing.results_s +
                                                  timing.kernels_s);
  EXPECT_TRUE(window_->runPanel()
                  ->findChild<QLabel*>(QStringLiteral("RunStatus"))
                  ->text()
                  .contains(QStringLiteral("Finished in")));
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
// issue #34: control and unused tokens show compactly in the text diff ("⟨u82⟩", not
// "<unused82>"), words as they are.
TEST(TokenText, ControlAndUnusedTokensAreCompact) {
  auto tokenizer = setup::tokenizer_for(smallSpec().model);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.error().message;
  const text::Tokenizer& t = *tokenizer.value();
  int compact = 0;
  for (std::int64_t id = 0; id < t.vocab_size(); ++id) {
    const std::string piece = t.piece(id);
    const QString shown = tokenText(&t, id);
    if (piece.rfind("<unused", 0) == 0) {
      EXPECT_EQ(shown, QStringLiteral("⟨u%1⟩").arg(
                           QString::fromStdString(piece.substr(7, piece.size() - 8))))
          << piece;
      ++compact;
    } else if (t.is_special(id)) {
      EXPECT_TRUE(shown.startsWith(QStringLiteral("⟨")) && shown.endsWith(QStringLiteral("⟩")))
          << piece << " -> " << shown.toStdString();
      EXPECT_LE(shown.size(), static_cast<int>(piece.size())) << piece;
    }
  }
  EXPECT_GT(compact, 0) << "the preset's vocabulary has <unusedN> tokens";
  // A word's token shows as its text.
  const auto word = t.encode("the");
  ASSERT_TRUE(word.ok());
  ASSERT_FALSE(word.value().empty());
  EXPECT_EQ(tokenText(&t, word.value()[0]), QString::fromStdString(t.decode({word.value()[0]})));
  EXPECT_FALSE(tokenText(&t, word.value()[0]).contains(QStringLiteral("⟨")));
}

}  // namespace batchlens::ui
