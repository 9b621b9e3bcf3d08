// SPDX-License-Identifier: Apache-2.0
#include "ui/main_window.h"

#include <QAction>
#include <QApplication>
#include <QDockWidget>
#include <QLabel>
#include <QMenuBar>
#include <QStatusBar>
#include <gtest/gtest.h>

namespace batchlens::ui {
namespace {

base::SystemInfo gpuMachine() {
  base::SystemInfo s;
  s.host = "gpu-server";
  s.os = "Linux 6.8 x86_64";
  s.cpu_model = "Test CPU";
  s.hardware_threads = 16;
  s.torch_threads = 16;
  s.libtorch_version = "2.11.0";
  s.blas = "mkl";
  s.cuda_build = true;
  s.cuda_runtime_version = 13000;
  s.cuda_driver_version = 13000;
  base::GpuInfo gpu;
  gpu.index = 0;
  gpu.name = "NVIDIA H200";
  gpu.total_memory = 141LL * 1024 * 1024 * 1024;
  gpu.compute_major = 9;
  s.gpus.push_back(gpu);
  return s;
}

TEST(MainWindow, ShowsTheEnvironmentItWasGiven) {
  MainWindow window(gpuMachine());
  EXPECT_EQ(window.windowTitle(), QStringLiteral("BatchLens"));
  const QString summary = window.environmentSummary();
  EXPECT_TRUE(summary.contains(QStringLiteral("LibTorch 2.11.0"))) << summary.toStdString();
  EXPECT_TRUE(summary.contains(QStringLiteral("cuda:0 NVIDIA H200"))) << summary.toStdString();

  auto* label = window.findChild<QLabel*>(QStringLiteral("EnvironmentLabel"));
  ASSERT_NE(label, nullptr);
  EXPECT_EQ(label->text(), summary);

  const QString about = environmentHtml(gpuMachine());
  EXPECT_TRUE(about.contains(QStringLiteral("NVIDIA H200"))) << about.toStdString();
  EXPECT_TRUE(about.contains(QStringLiteral("16 hardware threads"))) << about.toStdString();
  EXPECT_TRUE(about.contains(QStringLiteral("runtime 13.0"))) << about.toStdString();
}

TEST(MainWindow, CpuOnlyBuildSaysSo) {
  base::SystemInfo s;
  s.libtorch_version = "1.13.0";
  s.torch_threads = 2;
  MainWindow window(s);
  EXPECT_TRUE(window.environmentSummary().contains(QStringLiteral("CUDA: not in this build")));
}

TEST(MainWindow, HasFileAndHelpMenus) {
  MainWindow window(gpuMachine());
  QStringList titles;
  for (QAction* a : window.menuBar()->actions()) {
    titles << a->text();
  }
  EXPECT_TRUE(titles.contains(QStringLiteral("&File"))) << titles.join(',').toStdString();
  EXPECT_TRUE(titles.contains(QStringLiteral("&Run"))) << titles.join(',').toStdString();
  EXPECT_TRUE(titles.contains(QStringLiteral("&Help"))) << titles.join(',').toStdString();
}

TEST(MainWindow, HtmlEscapesHostileNames) {
  auto s = gpuMachine();
  s.gpus[0].name = "<script>GPU</script>";
  const QString html = environmentHtml(s);
  EXPECT_FALSE(html.contains(QStringLiteral("<script>")));
  EXPECT_TRUE(html.contains(QStringLiteral("&lt;script&gt;")));
}

}  // namespace
// issue #34: the window fits a 1024-pixel-wide screen, and the Run dock, squeezed by a narrow
// window, gets its width back once the window is wide again.
TEST(MainWindow, FitsA1024WideScreenAndTheRunDockRecovers) {
  MainWindow window(gpuMachine());
  window.show();
  window.resize(1500, 950);
  QApplication::processEvents();
  auto* dock = window.findChild<QDockWidget*>(QStringLiteral("RunDock"));
  ASSERT_NE(dock, nullptr);
  const int wide = dock->width();
  EXPECT_GE(wide, 380);
  EXPECT_LE(window.minimumSizeHint().width(), 1024)
      << "centre " << window.centralWidget()->minimumSizeHint().width() << ", status bar "
      << window.statusBar()->minimumSizeHint().width() << ", dock "
      << dock->minimumSizeHint().width() << ", menu "
      << window.menuBar()->minimumSizeHint().width();
  window.resize(1024, 768);
  QApplication::processEvents();
  EXPECT_EQ(window.width(), 1024);
  window.resize(700, 768);
  QApplication::processEvents();
  window.resize(1500, 950);
  QApplication::processEvents();
  EXPECT_NEAR(dock->width(), wide, 8);
}

}  // namespace batchlens::ui
