// SPDX-License-Identifier: Apache-2.0
// The GUI's SSH targets (issue #36) against a real OpenSSH server on 127.0.0.1
// (tests/app/sshd_server.sh, as the CLI's remote test): the dialog probes a target and the Run
// panel lists its devices; a run on a target comes back as a file and opens; Cancel ends it
// there and leaves nothing here; the workaround toggle of an experiment recorded on a target's
// host runs there instead of offering a command.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <QCheckBox>
#include <QComboBox>
#include <QDir>
#include <QDoubleSpinBox>
#include <QFileInfo>
#include <QGroupBox>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QSettings>
#include <QSignalSpy>
#include <QSpinBox>
#include <QTableWidget>
#include <QTemporaryDir>
#include <gtest/gtest.h>

#include "core/base/system_info.h"
#include "core/experiment/runner.h"
#include "core/io/experiment_file.h"
#include "tests/support/process.h"
#include "tests/support/slurm.h"
#include "tests/support/sshd.h"
#include "tests/support/ui_window.h"
#include "ui/controllers.h"
#include "ui/remote_targets.h"
#include "ui/run_panel.h"
#include "ui/sweep_dialog.h"
#include "ui/sweep_view.h"

#include <unistd.h>

namespace batchlens::ui {
namespace {

namespace fs = std::filesystem;
using test_support::kWaitMs;

// A tiny CPU run: B=1 and B=2 of the emulation, one canvas of `tokens` tokens.
experiment::ExperimentSpec tiny_spec(int steps, int tokens) {
  experiment::ExperimentSpec s;
  s.model.preset = "tiny";
  s.prompt = "It's \"quoted\"; $(touch CANARY) a\nnew line";
  s.batch_sizes = {2};
  s.repeats = 0;
  s.overrides.max_denoising_steps = steps;
  s.overrides.max_new_tokens = tokens;
  s.policy = ops::OpPolicy::emulation_profile("emulated_h200");
  return s;
}

class RemoteGuiTest : public test_support::WindowTest {
 protected:
  RemoteGuiTest() : WindowTest("remote_test", QSize(1400, 900)) {}

  void SetUp() override { start(); }
  // The test's folder, its sshd (`session_env` set in its sessions) and the window.
  void start(const std::string& session_env = {}) {
    dir_ = fs::temp_directory_path() / ("bl_remote_gui_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    bool skip = false;
    const std::string why = testing::start_sshd(server(), skip, session_env);
    if (skip) {
      GTEST_SKIP() << why;
    }
    ASSERT_EQ(why, "");
    up_ = true;
    WindowTest::SetUp();
    window_->runController()->setRemoteRunsDir(QString::fromStdString((dir_ / "here").string()));
  }
  void TearDown() override {
    if (window_) {
      window_->runController()->cancel();
    }
    WindowTest::TearDown();
    if (up_) {
      testing::stop_sshd(server(), work());
    }
    fs::remove_all(dir_);
  }

  fs::path server() const { return dir_ / "sshd"; }
  fs::path work() const { return dir_ / "work"; }

  // This test's sshd as a target, probed.
  RemoteTarget probed_target() const {
    RemoteTarget t;
    t.ssh.host = "bltest";
    t.ssh.cli = BL_CLI_PATH;
    t.ssh.workdir = work().string();
    t.ssh.ssh_options = {"-F", (server() / "ssh_config").string()};
    return probeTarget(t);
  }

  // Opens an experiment of this host whose kernels this build would not reproduce (another
  // ATen capability in its provenance): nothing can be added to it here. `other` is it.
  void open_recorded_elsewhere(experiment::ExperimentResult& other) {
    auto ran = experiment::run_experiment(tiny_spec(2, 16));
    ASSERT_TRUE(ran.ok()) << ran.error().message;
    other = std::move(ran).value();
    other.provenance.cpu.aten_capability =
        other.provenance.cpu.aten_capability == "AVX512" ? "AVX2" : "AVX512";
    const std::string path = (dir_ / "recorded there.h5").string();
    ASSERT_TRUE(io::write_experiment(path, other).ok());
    open(path);
  }

  // The Run panel with `spec` on this test's target's cpu (probed); null (a failure recorded)
  // when the target does not answer.
  RunPanel* panel_on_target(const experiment::ExperimentSpec& spec) {
    const RemoteTarget target = probed_target();
    if (!target.info.has_value()) {
      ADD_FAILURE() << target.error.toStdString();
      return nullptr;
    }
    RunPanel* panel = window_->runPanel();
    panel->setRemoteTargets({target});
    panel->setSpec(spec);
    return panel->selectRemoteDevice(0, QStringLiteral("cpu")) ? panel : nullptr;
  }

  // Files under `dir` (none when it does not exist).
  static int files_in(const fs::path& dir) {
    int n = 0;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      n += e.is_regular_file() ? 1 : 0;
    }
    return n;
  }

  fs::path dir_;
  bool up_ = false;
};

TEST_F(RemoteGuiTest, TheDialogProbesATargetAndThePanelListsItsDevices) {
  RemoteTargetsDialog dialog({});
  dialog.hostEdit()->setText(QStringLiteral("bltest"));
  dialog.cliEdit()->setText(QStringLiteral(BL_CLI_PATH));
  dialog.workdirEdit()->setText(QString::fromStdString(work().string()));
  dialog.sshOptionsEdit()->setText(
      QStringLiteral("-F \"%1\"").arg(QString::fromStdString((server() / "ssh_config").string())));
  QSignalSpy probed(&dialog, &RemoteTargetsDialog::probed);
  ASSERT_TRUE(dialog.addFromFields());
  ASSERT_TRUE(probed.wait(kWaitMs));
  ASSERT_EQ(dialog.targets().size(), 1U);
  const RemoteTarget t = dialog.targets()[0];  // a copy: adding a target moves the list
  ASSERT_TRUE(t.info.has_value()) << t.error.toStdString();
  EXPECT_EQ(t.info->hostname, base::query_system_info().value().host);
  EXPECT_EQ(t.info->devices.back(), "cpu");
  EXPECT_TRUE(dialog.table()->item(0, 3)->text().contains(QStringLiteral("BatchLens")));
  // Twice the same target, an ssh option as a target: refused with the reason.
  dialog.hostEdit()->setText(QStringLiteral("bltest"));
  EXPECT_FALSE(dialog.addFromFields());
  EXPECT_TRUE(dialog.messageLabel()->text().contains(QStringLiteral("listed already")));
  dialog.hostEdit()->setText(QStringLiteral("-oProxyCommand=touch x"));
  EXPECT_FALSE(dialog.addFromFields());
  // A host that does not answer: listed with the reason, its devices not offered.
  dialog.hostEdit()->setText(QStringLiteral("nohost.invalid"));
  dialog.sshOptionsEdit()->setText(QStringLiteral("-o ConnectTimeout=5"));
  ASSERT_TRUE(dialog.addFromFields());
  ASSERT_TRUE(probed.wait(kWaitMs));
  ASSERT_EQ(dialog.targets().size(), 2U);
  EXPECT_FALSE(dialog.targets()[1].info.has_value());
  EXPECT_FALSE(dialog.targets()[1].error.isEmpty());

  RunPanel* panel = window_->runPanel();
  panel->setRemoteTargets(dialog.targets());
  QComboBox* devices = panel->deviceCombo();
  const int remote_cpu = devices->findText(QStringLiteral("bltest: cpu"));
  ASSERT_GE(remote_cpu, 0);
  const int unreachable = devices->findText(QStringLiteral("nohost.invalid — not reachable"));
  ASSERT_GE(unreachable, 0);
  devices->setCurrentIndex(unreachable);
  EXPECT_FALSE(panel->deviceAvailable());
  EXPECT_FALSE(panel->spec().ok());
  devices->setCurrentIndex(remote_cpu);
  EXPECT_TRUE(panel->deviceAvailable());
  ASSERT_TRUE(panel->remoteTarget().has_value());
  EXPECT_EQ(panel->remoteTarget()->host, "bltest");
  ASSERT_TRUE(panel->spec().ok());
  EXPECT_EQ(panel->spec().value().load.device, "cpu");
  EXPECT_TRUE(panel->expectedText().contains(QStringLiteral("measured on bltest")))
      << panel->expectedText().toStdString();
  // Kept across a restart (QSettings), the chosen target's device too.
  {
    QSettings settings;
    saveRemoteTargets(settings, dialog.targets());
    panel->saveSettings(settings);
  }
  QSettings settings;
  RunPanel again(test_support::thisMachine());
  again.setRemoteTargets(loadRemoteTargets(settings));
  again.restoreSettings(settings);
  ASSERT_TRUE(again.remoteTarget().has_value());
  EXPECT_EQ(again.remoteTarget()->ssh_options, dialog.targets()[0].ssh.ssh_options);
  ASSERT_TRUE(again.remoteTargets()[0].info.has_value());
  EXPECT_EQ(again.remoteTargets()[0].info->hostname, t.info->hostname);
  // The local CPU is still the first choice.
  devices->setCurrentIndex(0);
  EXPECT_FALSE(panel->remoteTarget().has_value());
}

TEST_F(RemoteGuiTest, ARunOnATargetComesBackAsAFileAndOpens) {
  const RemoteTarget target = probed_target();
  ASSERT_TRUE(target.info.has_value()) << target.error.toStdString();
  RunController* runs = window_->runController();
  QSignalSpy finished(runs, &RunController::finished);
  QSignalSpy failed(runs, &RunController::failed);
  QSignalSpy progress(runs, &RunController::progressChanged);
  ASSERT_TRUE(runs->startRemote(target.ssh, tiny_spec(2, 16)));
  EXPECT_EQ(runs->remoteName().toStdString(), "bltest");
  ASSERT_TRUE(finished.wait(kWaitMs) || !failed.isEmpty())
      << (failed.isEmpty() ? "" : failed.first().at(0).toString().toStdString());
  ASSERT_EQ(finished.size(), 1) << failed.first().at(0).toString().toStdString();
  EXPECT_GT(progress.size(), 0);
  const ExperimentDocument& doc = window_->state()->document();
  ASSERT_NE(doc.result, nullptr);
  EXPECT_FALSE(doc.modified);  // its file is here already
  EXPECT_TRUE(doc.origin.startsWith(QStringLiteral("run on bltest")));
  EXPECT_TRUE(QFileInfo(doc.path).isFile());
  EXPECT_TRUE(doc.path.startsWith(QString::fromStdString((dir_ / "here").string())));
  // The file here is the target's, whole: it reads back, and the target keeps its copy.
  auto back = io::read_experiment(doc.path.toStdString());
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back.value().spec.prompt, tiny_spec(2, 16).prompt);
  EXPECT_EQ(files_in(work()), 1);
  EXPECT_FALSE(fs::exists(work() / "CANARY")) << "a prompt ran as a command";
  EXPECT_FALSE(fs::exists(fs::current_path() / "CANARY")) << "a prompt ran as a command";
}

// The Run panel on a target's device: Run and Run > Find culprit go there, the files come back.
TEST_F(RemoteGuiTest, RunAndFindCulpritFromThePanelGoToTheTarget) {
  RunPanel* panel = panel_on_target(tiny_spec(2, 16));
  ASSERT_NE(panel, nullptr);
  QComboBox* strategy = panel->workaroundStrategyBox();
  strategy->setCurrentIndex(strategy->findData(static_cast<int>(ops::Strategy::BatchInvariant)));
  QSignalSpy shown(window_.get(), &MainWindow::documentShown);
  window_->findCulprit();
  ASSERT_TRUE(window_->runController()->isRunning());
  EXPECT_EQ(window_->runController()->remoteName().toStdString(), "bltest");
  ASSERT_TRUE(shown.wait(kWaitMs)) << window_->lastError().toStdString();
  const auto* r = window_->state()->result();
  ASSERT_NE(r, nullptr);
  ASSERT_TRUE(r->culprit.has_value());
  EXPECT_TRUE(r->culprit->found) << r->culprit->verdict;
  EXPECT_EQ(r->culprit->strategy, ops::Strategy::BatchInvariant);
  EXPECT_TRUE(window_->state()->document().path.startsWith(
      QString::fromStdString((dir_ / "here").string())));
  panel->runButton()->click();
  ASSERT_TRUE(window_->runController()->isRunning());
  EXPECT_EQ(window_->runController()->remoteName().toStdString(), "bltest");
  ASSERT_TRUE(shown.wait(kWaitMs)) << window_->lastError().toStdString();
  EXPECT_FALSE(window_->state()->result()->culprit.has_value());
  EXPECT_EQ(files_in(dir_ / "here"), 2);
  EXPECT_EQ(files_in(work()), 2);
}

TEST_F(RemoteGuiTest, CancelEndsTheRemoteRunAndLeavesNothingHere) {
  const RemoteTarget target = probed_target();
  ASSERT_TRUE(target.info.has_value()) << target.error.toStdString();
  RunController* runs = window_->runController();
  QSignalSpy cancelled(runs, &RunController::cancelled);
  QSignalSpy progress(runs, &RunController::progressChanged);
  ASSERT_TRUE(runs->startRemote(target.ssh, tiny_spec(48, 2048)));
  // Cancel once the target reports steps (the run is going there).
  for (int i = 0; i < 600 && progress.isEmpty(); ++i) {
    progress.wait(100);
  }
  ASSERT_FALSE(progress.isEmpty());
  runs->cancel();
  ASSERT_TRUE(cancelled.wait(kWaitMs));
  EXPECT_FALSE(runs->isRunning());
  EXPECT_EQ(files_in(dir_ / "here"), 0) << "a cancelled remote run left a file here";
  // The remote process group ended: no run of this work folder is left on the target.
  const auto left = testing::run_process(
      {"/bin/sh", "-c",
       "for p in $(pgrep -f 'batchlens-cli run --spec-json'); do [ \"$(readlink /proc/$p/cwd)\" "
       "= '" +
           work().string() + "' ] && echo $p; done; true"});
  EXPECT_EQ(left.out, "") << "remote runs still going: " << left.out;
}

TEST_F(RemoteGuiTest, TheWorkaroundToggleRunsAgainOnTheHostItWasRecordedOn) {
  // Here the toggle is refused (other kernels); with a target on its host it runs there.
  experiment::ExperimentResult other;
  ASSERT_NO_FATAL_FAILURE(open_recorded_elsewhere(other));
  const RemoteTarget target = probed_target();
  ASSERT_TRUE(target.info.has_value()) << target.error.toStdString();
  ASSERT_EQ(target.info->hostname, other.provenance.host);
  RunPanel* panel = window_->runPanel();
  panel->setRemoteTargets({target});
  RunController* runs = window_->runController();
  QSignalSpy finished(runs, &RunController::finished);
  QSignalSpy offered(window_.get(), &MainWindow::workaroundElsewhereOffered);
  panel->workaroundCheck()->click();
  EXPECT_TRUE(offered.isEmpty()) << "a command was offered although the host is a target";
  ASSERT_TRUE(runs->isRunning());
  EXPECT_EQ(runs->remoteName().toStdString(), "bltest");
  EXPECT_EQ(runs->lastSpec().workaround, ops::OpPolicy::issue_workaround());
  EXPECT_EQ(runs->lastSpec().prompt_ids, other.prompt_ids);
  ASSERT_TRUE(finished.wait(kWaitMs));
  const auto* shown = window_->state()->result();
  ASSERT_NE(shown, nullptr);
  ASSERT_TRUE(shown->spec.workaround.has_value());
  EXPECT_EQ(*shown->spec.workaround, ops::OpPolicy::issue_workaround());
  EXPECT_EQ(shown->prompt_ids, other.prompt_ids);
  EXPECT_TRUE(panel->workaroundCheck()->isChecked());
}

// File > Export minimal repro of an experiment this machine cannot reproduce, recorded on a
// target's host: exported there, the folder back here.
TEST_F(RemoteGuiTest, ReproOfAnExperimentRecordedOnATargetIsExportedThere) {
  experiment::ExperimentResult other;
  ASSERT_NO_FATAL_FAILURE(open_recorded_elsewhere(other));
  const RemoteTarget target = probed_target();
  ASSERT_TRUE(target.info.has_value()) << target.error.toStdString();
  window_->runPanel()->setRemoteTargets({target});
  const QString dir = QString::fromStdString((dir_ / "here" / "the repro").string());
  QSignalSpy exported(window_.get(), &MainWindow::reproExported);
  ASSERT_TRUE(window_->exportReproTo(dir)) << window_->lastError().toStdString();
  EXPECT_EQ(window_->runController()->remoteName().toStdString(), "bltest");
  ASSERT_TRUE(exported.wait(kWaitMs)) << window_->lastError().toStdString();
  for (const char* f : {"repro.py", "inputs.safetensors", "op.json", "README.md"}) {
    EXPECT_TRUE(QFileInfo::exists(QDir(dir).filePath(QString::fromLatin1(f)))) << f;
  }
}

// Run > Run sweep… on a target's device (issue #36): the sweep runs there, its file comes back
// checked and opens in the Sweep tab; prompts travel as data.
TEST_F(RemoteGuiTest, ASweepFromTheDialogRunsOnTheTargetAndOpens) {
  RunPanel* panel = panel_on_target(tiny_spec(2, 16));
  ASSERT_NE(panel, nullptr);
  const fs::path prompts = dir_ / "prompts.txt";
  std::ofstream(prompts) << "Tides?\nWhy \"blue\"? $(touch " << (dir_ / "CANARY").string() << ")\n";
  SweepDialog* dialog = window_->chooseSweep();
  ASSERT_NE(dialog, nullptr);
  EXPECT_TRUE(dialog->slurmBox()->isEnabled());
  dialog->promptsEdit()->setText(QString::fromStdString(prompts.string()));
  dialog->seedsEdit()->setText(QStringLiteral("0"));
  dialog->refresh();
  ASSERT_TRUE(dialog->runButton()->isEnabled()) << dialog->summaryLabel()->text().toStdString();
  QSignalSpy shown(window_.get(), &MainWindow::sweepShown);
  dialog->runButton()->click();
  EXPECT_EQ(window_->runController()->remoteName().toStdString(), "bltest");
  ASSERT_TRUE(shown.wait(kWaitMs)) << window_->lastError().toStdString();
  const SweepDocument& doc = window_->sweep()->document();
  ASSERT_NE(doc.sweep, nullptr);
  EXPECT_EQ(doc.sweep->items_done, 2);
  EXPECT_TRUE(doc.path.startsWith(QString::fromStdString((dir_ / "here").string())))
      << doc.path.toStdString();
  EXPECT_FALSE(fs::exists(dir_ / "CANARY")) << "a prompt ran as a command";
}

// A Slurm login node (this test's sshd in front of a real single-node cluster): the sweep dialog
// submits the job array there, the progress names the tasks, the merged file opens here; Cancel
// of another sweep cancels its jobs (scancel), said in the Run panel.
class RemoteSlurmGuiTest : public RemoteGuiTest {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<testing::SlurmCluster>(
        fs::temp_directory_path() / ("bl_remote_gui_slurm_" + std::to_string(::getpid())));
    if (const std::string why = cluster_->unavailable(); !why.empty()) {
      GTEST_SKIP() << why;
    }
    ASSERT_EQ(cluster_->start(), "");
    start("SLURM_CONF=" + cluster_->conf().string());
  }
  void TearDown() override {
    RemoteGuiTest::TearDown();
    cluster_.reset();
  }

  // The sweep dialog on the target's cpu, its Slurm box checked (2 tasks, no GPU, fast polls).
  SweepDialog* slurm_dialog(const std::string& seeds) {
    SweepDialog* dialog = window_->chooseSweep();
    if (dialog == nullptr) {
      return nullptr;
    }
    dialog->promptsEdit()->setText(QString::fromStdString((dir_ / "prompts.txt").string()));
    dialog->seedsEdit()->setText(QString::fromStdString(seeds));
    dialog->slurmBox()->setChecked(true);
    dialog->shardsSpin()->setValue(2);
    dialog->gpusSpin()->setValue(0);
    dialog->findChild<QDoubleSpinBox*>()->setValue(0.5);
    dialog->refresh();
    return dialog;
  }

  std::unique_ptr<testing::SlurmCluster> cluster_;
};

TEST_F(RemoteSlurmGuiTest, ASweepIsSubmittedThereFollowedAndCancelled) {
  RunPanel* panel = panel_on_target(tiny_spec(2, 16));
  ASSERT_NE(panel, nullptr);
  std::ofstream(dir_ / "prompts.txt") << "Tides?\nExplain the moon.\n";
  SweepDialog* dialog = slurm_dialog("0-1");
  ASSERT_NE(dialog, nullptr);
  ASSERT_TRUE(dialog->slurm().has_value());
  EXPECT_EQ(dialog->slurm()->shards, 2);
  QSignalSpy shown(window_.get(), &MainWindow::sweepShown);
  QSignalSpy progress(window_->runController(), &RunController::progressChanged);
  dialog->runButton()->click();
  ASSERT_TRUE(shown.wait(kWaitMs)) << window_->lastError().toStdString();
  bool named_tasks = false;
  for (const QList<QVariant>& p : progress) {
    named_tasks =
        named_tasks || p.at(0).value<base::Progress>().stage.find("bltest: Slurm job") == 0;
  }
  EXPECT_TRUE(named_tasks) << "the progress names the Slurm tasks";
  const SweepDocument& doc = window_->sweep()->document();
  ASSERT_NE(doc.sweep, nullptr);
  EXPECT_EQ(doc.sweep->items_done, 4);

  // Another sweep (48 steps an item), cancelled while its tasks are queued or running.
  panel->setSpec(tiny_spec(48, 16));
  ASSERT_TRUE(panel->selectRemoteDevice(0, QStringLiteral("cpu")));
  dialog = slurm_dialog("0-5");
  ASSERT_NE(dialog, nullptr);
  QSignalSpy cancelled(window_->runController(), &RunController::cancelled);
  progress.clear();
  dialog->runButton()->click();
  ASSERT_TRUE(progress.wait(kWaitMs));
  window_->runController()->cancel();
  ASSERT_TRUE(cancelled.wait(kWaitMs)) << window_->lastError().toStdString();
  EXPECT_TRUE(window_->runController()->cancelNote().contains(QStringLiteral("scancel ended")))
      << window_->runController()->cancelNote().toStdString();
  EXPECT_TRUE(panel->message().contains(QStringLiteral("scancel ended")))
      << panel->message().toStdString();
}

}  // namespace
}  // namespace batchlens::ui
