// SPDX-License-Identifier: Apache-2.0
// The window with results it must not trust (runs of different lengths, arrays that do not fit
// their shapes, text that is not UTF-8) and with disks that refuse writes (issue #14).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <QCoreApplication>
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QMessageBox>
#include <QPushButton>
#include <QSettings>
#include <QSignalSpy>
#include <QSlider>
#include <QTemporaryDir>
#include <QTextBrowser>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/experiment/runner.h"
#include "core/io/experiment_file.h"
#include "tests/support/ui_window.h"
#include "ui/controllers.h"
#include "ui/explorer_state.h"
#include "ui/heatmap_plot.h"
#include "ui/main_window.h"
#include "ui/report_export.h"
#include "ui/views.h"

#include <sys/mount.h>
#include <unistd.h>

namespace batchlens::ui {
namespace {

namespace fs = std::filesystem;

using test_support::kWaitMs;
using test_support::thisMachine;
constexpr int kLayers = 2;
constexpr int kCanvas = 4;
constexpr int kTaps = 2;

experiment::RunResult makeRun(const std::string& id, std::int64_t batch, int ticks) {
  experiment::RunResult run;
  run.id = id;
  run.batch_size = batch;
  run.group = experiment::RunGroup::Main;
  run.policy_text = "default";
  run.policy_json = "{}";
  for (auto* a : {&run.canvas_in, &run.argmax, &run.sampled}) {
    *a = experiment::NdArray<std::int64_t>({ticks, kCanvas}, 7);
  }
  run.accepted = experiment::NdArray<std::uint8_t>({ticks, kCanvas}, 1);
  run.entropy = experiment::NdArray<float>({ticks, kCanvas}, 0.5F);
  for (int t = 0; t < ticks; ++t) {
    run.tick_canvas.push_back(0);
    run.tick_step.push_back(t + 1);
    run.canvas_in.at({t, 1}) = 100 + t + batch;  // position 1 differs between the runs
  }
  run.tokens = {7, 8, 9, 10};
  run.stop_position = 3;
  run.steps = {ticks};
  // A byte-fallback token can end a run's text in the middle of a UTF-8 sequence.
  run.text = "caf\xC3 " + id + " \xFF\xFE";
  return run;
}

// A B=1 reference of 6 ticks against a B=2 run of `run_ticks`. `ragged` also gives the routing
// arrays less data than their shape says.
experiment::ExperimentResult makeResult(int run_ticks, bool ragged) {
  constexpr int kTicks = 6;
  experiment::ExperimentResult r;
  r.spec.model.preset = "tiny";
  r.spec.batch_sizes = {2};
  r.spec.prompt = "prompt \xE2\x82";  // cut inside a three-byte sequence
  r.prompt_text = r.spec.prompt;
  r.provenance.device = "cpu";
  r.provenance.device_name = "test CPU";
  r.provenance.tool_version = "test";
  r.provenance.created_utc = "2026-01-01T00:00:00Z";
  r.taps = {"layer.out", "logits"};
  r.layers = kLayers;
  r.canvas_length = kCanvas;
  r.top_k = 2;
  r.config_json = "{}";
  r.generation_config_json = "{}";
  r.prompt_ids = {2, 3};
  r.runs.push_back(makeRun("ref", 1, kTicks));
  r.runs.push_back(makeRun("b2", 2, run_ticks));
  experiment::ComparisonResult c;
  c.id = "ref__b2";
  c.reference = "ref";
  c.run = "b2";
  for (auto* a : {&c.frac_differ, &c.max_abs, &c.max_ulp}) {
    *a = experiment::NdArray<float>({kTicks, kLayers + 1, kTaps}, 0.25F);
  }
  for (auto* a : {&c.pos_frac_differ, &c.pos_max_abs, &c.pos_max_ulp}) {
    *a = experiment::NdArray<float>({kTicks, kLayers + 1, kTaps, kCanvas}, 0.5F);
  }
  c.routing_flips = experiment::NdArray<std::uint8_t>({kTicks, kLayers, kCanvas}, 1);
  c.router_margin = experiment::NdArray<float>({kTicks, kLayers, kCanvas}, 0.01F);
  if (ragged) {
    c.routing_flips.data.resize(kCanvas);  // one row where the shape promises 48
    c.router_margin.data.resize(3);
  }
  c.sampler_diff = experiment::NdArray<std::uint8_t>({kTicks, kCanvas}, 0);
  c.compared.assign(kTicks, 1);
  c.first.tick = kTicks - 1;
  c.first.canvas = 0;
  c.first.step = kTicks;
  c.first.layer = 1;
  c.first.tap = "layer.out";
  c.first.position = 1;
  c.tokens_identical = false;
  c.tokens_changed = 1;
  c.token_diff.push_back({text::TokenEdit::Op::Equal, 0, 0});
  c.token_diff.push_back({text::TokenEdit::Op::Replace, 1, 1});
  r.comparisons.push_back(std::move(c));
  return r;
}

ExperimentDocument runDocument(experiment::ExperimentResult result) {
  ExperimentDocument doc;
  doc.result = std::make_shared<const experiment::ExperimentResult>(std::move(result));
  doc.origin = QStringLiteral("run at test");
  doc.modified = true;  // as RunController hands over a run
  return doc;
}

bool hasTemporary(const QString& dir) {
  for (const QString& name :
       QDir(dir).entryList(QDir::AllEntries | QDir::Hidden | QDir::NoDotAndDotDot)) {
    if (name.contains(QStringLiteral(".tmp-"))) {
      return true;
    }
  }
  return false;
}

TEST(ElementAt, RefusesEveryIndexOutsideTheArray) {
  experiment::NdArray<int> a({2, 3}, 0);
  a.at({1, 2}) = 5;
  ASSERT_NE(elementAt(a, {1, 2}), nullptr);
  EXPECT_EQ(*elementAt(a, {1, 2}), 5);
  EXPECT_EQ(elementAt(a, {2, 0}), nullptr);
  EXPECT_EQ(elementAt(a, {0, 3}), nullptr);
  EXPECT_EQ(elementAt(a, {-1, 0}), nullptr);
  EXPECT_EQ(elementAt(a, {1}), nullptr) << "another rank";
  a.data.pop_back();
  EXPECT_EQ(elementAt(a, {0, 0}), nullptr) << "data that does not hold the shape";
  experiment::NdArray<int> huge;
  huge.shape = {std::int64_t{1} << 40, std::int64_t{1} << 40};
  huge.data = {1};
  EXPECT_EQ(elementAt(huge, {0, 0}), nullptr) << "a shape whose size overflows";
  const std::vector<int> v{1, 2};
  EXPECT_EQ(elementAt(v, 2), nullptr);
  EXPECT_EQ(elementAt(v, -1), nullptr);
  EXPECT_EQ(*elementAt(v, 1), 2);
}

TEST(ElementAt, CellValuesOutsideTheirArraysAreNaN) {
  auto r = makeResult(6, false);
  auto& c = r.comparisons.front();
  EXPECT_FLOAT_EQ(cellValue(c, Metric::FracDiffer, 5, 2, 1), 0.25F);
  c.frac_differ.data.resize(10);  // a damaged file: the shape promises 36
  EXPECT_TRUE(std::isnan(cellValue(c, Metric::FracDiffer, 5, 2, 1)));
  c.compared.push_back(1);  // a tick compared that the arrays do not have
  EXPECT_TRUE(std::isnan(positionValue(c, Metric::MaxAbs, 6, 0, 0, 0)));
  EXPECT_TRUE(std::isnan(positionValue(c, Metric::MaxAbs, 0, 0, 0, kCanvas)));
}

// The reference has 6 ticks, the batched run 3: the replay at tick 5 must not read the run's
// canvas (nor the reference's where the reference is the shorter one).
TEST(TextDiffView, RunsOfDifferentLengthsAreNeverReadPastTheirEnd) {
  ExplorerState state;
  TextDiffView view(&state);
  state.setDocument(runDocument(makeResult(3, true)));
  view.flush();
  EXPECT_EQ(view.stepSlider()->maximum(), 5);
  view.stepSlider()->setValue(5);
  view.flush();
  ASSERT_EQ(state.tick(), 5);
  const QString html = view.html(Side::Before);
  // The aligned replay shows the reference's canvas and says the run has none to compare.
  EXPECT_TRUE(html.contains(QStringLiteral("b2 did not step there"))) << html.toStdString();
  EXPECT_TRUE(html.contains(QStringLiteral("nothing to compare"))) << html.toStdString();
  // Nothing is marked as differing where there is nothing to compare with.
  EXPECT_FALSE(html.contains(QStringLiteral(", differs"))) << html.toStdString();
  // At a tick both runs have, the replay compares them.
  view.stepSlider()->setValue(2);
  view.flush();
  EXPECT_TRUE(view.html(Side::Before).contains(QStringLiteral(", differs")));
  EXPECT_FALSE(view.html(Side::Before).contains(QStringLiteral("did not step there")));
}

// Every view over the same ragged result, at every tick the slider offers.
TEST(Views, RaggedResultsAreShownWithoutReadingPastTheirArrays) {
  MainWindow window(thisMachine());
  window.resize(1200, 800);
  window.show();
  Q_EMIT window.runController()->finished(runDocument(makeResult(3, true)));
  ASSERT_NE(window.state()->result(), nullptr);
  for (int tick = 0; tick < window.state()->ticks(); ++tick) {
    for (int slot = 0; slot <= kLayers; ++slot) {
      window.state()->setCell(tick, slot);
      window.state()->setPosition(tick % kCanvas);
      QCoreApplication::processEvents();
      window.overview()->flush();
      window.layerStep()->flush();
      window.spread()->flush();
      window.textDiff()->flush();
      window.routing()->flush();
    }
  }
  // Routing data the shape promises but the array does not hold counts as nothing flipped.
  const double flips = window.routing()->plot(Side::Before)->value(5, 1);
  EXPECT_TRUE(std::isnan(flips) || flips == 0.0) << flips;
  // The heatmap tooltips read the reference canvas at any cell.
  const QString tip = window.spread()->plot(Side::Before)->tooltipFor(5, kCanvas - 1);
  EXPECT_FALSE(tip.isEmpty());
}

class SafetyWindowTest : public test_support::WindowTest {
 protected:
  SafetyWindowTest() : WindowTest("safety_test", QSize(1200, 800)) {}
  void SetUp() override {
    ASSERT_TRUE(dir_.isValid());
    WindowTest::SetUp();
  }
  void TearDown() override {
    WindowTest::TearDown();
    for (const auto& m : mounts_) {
      ::umount2(m.c_str(), MNT_DETACH);
    }
  }

  // Shows `result` as a fresh, unsaved run.
  void showRun(experiment::ExperimentResult result) {
    QSignalSpy shown(window_.get(), &MainWindow::documentShown);
    Q_EMIT window_->runController()->finished(runDocument(std::move(result)));
    ASSERT_EQ(shown.count(), 1);
  }

  bool mountTmpfs(const QString& path, const char* size) {
    QDir().mkpath(path);
    const std::string data = std::string("size=") + size;
    if (::mount("tmpfs", QFile::encodeName(path).constData(), "tmpfs", 0, data.c_str()) != 0) {
      return false;
    }
    mounts_.push_back(QFile::encodeName(path).toStdString());
    return true;
  }

  QTemporaryDir dir_;
  std::vector<std::string> mounts_;
};

TEST_F(SafetyWindowTest, ReportOfTextsThatAreNotUtf8IsComplete) {
  showRun(makeResult(6, false));
  const QString out = dir_.filePath(QStringLiteral("report"));
  auto written = window_->exportReportTo(out + QStringLiteral("/"));
  ASSERT_TRUE(written.ok()) << written.error().message;
  EXPECT_EQ(written.value().size(), 8);
  EXPECT_EQ(QDir(out).entryList(QDir::Files).size(), 8);
  EXPECT_FALSE(hasTemporary(dir_.path()));
  QFile json_file(QDir(out).filePath(QStringLiteral("summary.json")));
  ASSERT_TRUE(json_file.open(QIODevice::ReadOnly));
  const std::string json = json_file.readAll().toStdString();
  const auto summary = nlohmann::json::parse(json);  // valid UTF-8, or this throws
  EXPECT_EQ(summary["selected_comparison"], "ref__b2");
  EXPECT_NE(json.find("\xEF\xBF\xBD"), std::string::npos) << "U+FFFD where the bytes were bad";
  QFile md(QDir(out).filePath(QStringLiteral("summary.md")));
  ASSERT_TRUE(md.open(QIODevice::ReadOnly));
  EXPECT_TRUE(QString::fromUtf8(md.readAll()).contains(QStringLiteral("ref__b2")));
}

TEST_F(SafetyWindowTest, ReportIntoAFolderWithFilesIsRefusedAndTouchesNothing) {
  showRun(makeResult(6, false));
  const QString out = dir_.filePath(QStringLiteral("mine"));
  QDir().mkpath(out);
  {
    QFile keep(QDir(out).filePath(QStringLiteral("keep.txt")));
    ASSERT_TRUE(keep.open(QIODevice::WriteOnly));
    keep.write("mine");
  }
  auto written = window_->exportReportTo(out);
  ASSERT_FALSE(written.ok());
  EXPECT_EQ(written.error().code, base::ErrorCode::InvalidArgument);
  EXPECT_NE(written.error().message.find("not empty"), std::string::npos)
      << written.error().message;
  EXPECT_EQ(QDir(out).entryList(QDir::AllEntries | QDir::NoDotAndDotDot),
            QStringList{QStringLiteral("keep.txt")});
  EXPECT_EQ(QDir(dir_.path()).entryList(QDir::AllEntries | QDir::NoDotAndDotDot).size(), 1);
  // The GUI offers a new folder inside it instead.
  const QString inside = newReportFolder(out, *window_->state());
  EXPECT_FALSE(QFileInfo::exists(inside));
  EXPECT_EQ(QFileInfo(inside).absolutePath(), QFileInfo(out).absoluteFilePath());
  EXPECT_TRUE(QFileInfo(inside).fileName().startsWith(QStringLiteral("batchlens-report-ref__b2-")));
  ASSERT_TRUE(window_->exportReportTo(inside).ok());
  // An empty folder is fine: it is replaced by the report.
  const QString empty = dir_.filePath(QStringLiteral("empty"));
  QDir().mkpath(empty);
  ASSERT_TRUE(window_->exportReportTo(empty).ok());
  EXPECT_EQ(QDir(empty).entryList(QDir::Files).size(), 8);
}

TEST_F(SafetyWindowTest, ReportThatCannotBeWrittenLeavesNothing) {
  showRun(makeResult(6, false));
  // The temporary's name is too long for the file system: fails before anything is written.
  const QString too_long = dir_.filePath(QString(250, QLatin1Char('r')));
  auto failed = window_->exportReportTo(too_long);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().code, base::ErrorCode::IoFailed);
  EXPECT_TRUE(QDir(dir_.path()).isEmpty()) << "no folder, no temporary";
  // A disk that fills while the pages are written.
  const QString disk = dir_.filePath(QStringLiteral("disk"));
  if (!mountTmpfs(disk, "48k")) {
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN)";
  }
  auto full = window_->exportReportTo(QDir(disk).filePath(QStringLiteral("report")));
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.error().message.find("No space left on device"), std::string::npos)
      << full.error().message;
  EXPECT_TRUE(QDir(disk).isEmpty()) << QDir(disk).entryList().join(QLatin1Char(' ')).toStdString();
}

TEST_F(SafetyWindowTest, FailedSaveKeepsTheRunAndOffersSaveAs) {
  showRun(makeResult(6, false));
  const auto* shown = window_->state()->result();
  QSignalSpy error(window_.get(), &MainWindow::errorShown);
  window_->saveTo(dir_.filePath(QStringLiteral("no/such/folder/run.h5")));
  ASSERT_TRUE(error.wait(kWaitMs));
  EXPECT_TRUE(window_->lastError().contains(QStringLiteral("No such file or directory")))
      << window_->lastError().toStdString();
  auto* box = window_->findChild<QMessageBox*>(QStringLiteral("SaveErrorDialog"));
  ASSERT_NE(box, nullptr);
  EXPECT_TRUE(box->isVisible());
  EXPECT_TRUE(box->text().contains(QStringLiteral("no/such/folder/run.h5")));
  EXPECT_NE(box->findChild<QPushButton*>(QStringLiteral("SaveAsButton")), nullptr);
  // Still shown, still unsaved.
  EXPECT_EQ(window_->state()->result(), shown);
  EXPECT_TRUE(window_->state()->document().modified);
  EXPECT_TRUE(window_->state()->document().path.isEmpty());
  EXPECT_TRUE(window_->isWindowModified());
  box->close();
}

TEST_F(SafetyWindowTest, ClosingDuringAFailingSaveKeepsTheWindowOpen) {
  showRun(makeResult(6, false));
  QSignalSpy error(window_.get(), &MainWindow::errorShown);
  window_->saveTo(dir_.filePath(QStringLiteral("no/such/folder/run.h5")));
  EXPECT_TRUE(window_->savingShown());
  EXPECT_FALSE(window_->close()) << "waits for the save instead of closing";
  ASSERT_TRUE(error.wait(kWaitMs));
  QCoreApplication::processEvents();
  EXPECT_TRUE(window_->isVisible());
  EXPECT_TRUE(window_->state()->document().modified);
  EXPECT_NE(window_->findChild<QMessageBox*>(QStringLiteral("SaveErrorDialog")), nullptr);
}

TEST_F(SafetyWindowTest, ClosingDuringASaveClosesOnceItIsOnDisk) {
  showRun(makeResult(6, false));
  const QString path = dir_.filePath(QStringLiteral("run.h5"));
  QSignalSpy saved(window_->fileController(), &FileController::saved);
  window_->saveTo(path);
  EXPECT_FALSE(window_->close());
  ASSERT_TRUE(saved.wait(kWaitMs)) << window_->lastError().toStdString();
  QCoreApplication::processEvents();
  QCoreApplication::processEvents();
  EXPECT_FALSE(window_->isVisible());
  EXPECT_FALSE(window_->state()->document().modified);
  EXPECT_EQ(window_->state()->document().path, path);
  EXPECT_TRUE(io::read_experiment(QFile::encodeName(path).toStdString()).ok());
}

TEST(SaveDialogDir, StartsInTheLastFolderOrHomeNeverTheRoot) {
  QTemporaryDir dir;
  ASSERT_TRUE(dir.isValid());
  const QString home = saveDialogDir(QString(), QString());
  EXPECT_FALSE(QDir(home).isRoot());
  EXPECT_TRUE(QFileInfo(home).isDir());
  EXPECT_EQ(saveDialogDir(dir.path(), QString()), QDir::cleanPath(dir.path()));
  EXPECT_EQ(saveDialogDir(QStringLiteral("/"), QString()), home);
  EXPECT_EQ(saveDialogDir(QStringLiteral("/nonexistent/folder"), QString()), home);
  EXPECT_EQ(saveDialogDir(QString(), dir.filePath(QStringLiteral("x.h5"))),
            QDir::cleanPath(dir.path()));
}

}  // namespace
}  // namespace batchlens::ui
