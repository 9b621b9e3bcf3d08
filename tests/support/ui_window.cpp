// SPDX-License-Identifier: Apache-2.0
#include "tests/support/ui_window.h"

#include <filesystem>
#include <map>
#include <utility>

#include <QCoreApplication>
#include <QDir>
#include <QSettings>
#include <QSignalSpy>

#include "core/experiment/runner.h"
#include "core/io/experiment_file.h"
#include "ui/controllers.h"
#include "ui/views.h"

#include <unistd.h>

namespace batchlens::ui::test_support {

base::SystemInfo thisMachine() {
  auto info = base::query_system_info();
  if (info.ok()) {
    return info.value();
  }
  base::SystemInfo s;
  s.libtorch_version = "unknown";
  s.torch_threads = 2;
  return s;
}

experiment::ExperimentSpec smallDemoSpec(std::uint64_t seed, int steps, ops::OpPolicy policy) {
  experiment::ExperimentSpec s;
  s.model.preset = "demo";
  s.seed = seed;
  s.overrides.max_denoising_steps = steps;
  s.overrides.max_new_tokens = 64;
  s.batch_sizes = {2, 4};
  s.policy = std::move(policy);
  return s;
}

const std::string& experimentFile(const std::string& name, const experiment::ExperimentSpec& spec) {
  static std::map<std::string, std::string> files;
  auto it = files.find(name);
  if (it == files.end()) {
    const std::string path = (std::filesystem::path(::testing::TempDir()) /
                              ("bl_" + name + "_" + std::to_string(::getpid()) + ".h5"))
                                 .string();
    auto r = experiment::run_experiment(spec);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    if (r.ok()) {
      EXPECT_TRUE(io::write_experiment(path, r.value()).ok());
    }
    it = files.emplace(name, path).first;
  }
  return it->second;
}

void WindowTest::SetUp() {
  qputenv("XDG_CONFIG_HOME",
          QDir(QString::fromStdString(::testing::TempDir()))
              .filePath(
                  QStringLiteral("bl-%1-config-%2").arg(QString::fromLatin1(app_)).arg(::getpid()))
              .toUtf8());
  QCoreApplication::setOrganizationName(QStringLiteral("BatchLensTests"));
  QCoreApplication::setApplicationName(QString::fromLatin1(app_));
  QSettings().clear();
  window_ = std::make_unique<MainWindow>(thisMachine());
  window_->resize(size_);
  window_->show();
}

void WindowTest::TearDown() {
  window_.reset();
}

void WindowTest::open(const std::string& path) {
  QSignalSpy shown(window_.get(), &MainWindow::documentShown);
  window_->openFile(QString::fromStdString(path));
  ASSERT_TRUE(shown.wait(kWaitMs))
      << "not shown: " << path << ": " << window_->lastError().toStdString();
  flushViews();
}

void WindowTest::openSample() {
  open(FileController::embeddedSamplePath().toStdString());
}

void WindowTest::flushViews() {
  QCoreApplication::processEvents();
  window_->overview()->flush();
  window_->layerStep()->flush();
  window_->spread()->flush();
  window_->textDiff()->flush();
  window_->routing()->flush();
}

}  // namespace batchlens::ui::test_support
