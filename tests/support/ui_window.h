// SPDX-License-Identifier: Apache-2.0
// The main window under test on the offscreen platform (ui tests): settings in a private
// folder, the window at a given size on this machine, opening a document and waiting for it;
// and the small demo experiments the tests open, run once per process.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <QSize>
#include <gtest/gtest.h>

#include "core/base/system_info.h"
#include "core/experiment/experiment.h"
#include "core/ops/policy.h"
#include "ui/main_window.h"

namespace batchlens::ui::test_support {

/// How long a test waits for a run, an open or a save (ms).
inline constexpr int kWaitMs = 120000;

/// This machine as the GUI sees it (base::query_system_info): experiments the tests run here
/// can be extended by the workaround toggle. A CPU-only machine when it cannot be asked.
base::SystemInfo thisMachine();

/// A small `demo` experiment: the B=1 reference and a repeat, B=2 and B=4, two canvases (64 new
/// tokens) of `steps` denoising steps, with `policy` (an emulation: the batch sizes diverge).
experiment::ExperimentSpec smallDemoSpec(std::uint64_t seed, int steps, ops::OpPolicy policy);

/// The file of `spec` run here, written once per process and `name` under the test temporary
/// folder (a failure when it does not run).
const std::string& experimentFile(const std::string& name, const experiment::ExperimentSpec& spec);

/// A MainWindow of `size` on thisMachine(), shown, with its settings (QSettings) in a private
/// folder named after `app` and cleared before each test.
class WindowTest : public ::testing::Test {
 protected:
  WindowTest(const char* app, QSize size) : app_(app), size_(size) {}
  void SetUp() override;
  void TearDown() override;

  /// Opens `path` (a file, or ":/samples/..." for an embedded sample) and waits until the window
  /// shows it; fails the test otherwise.
  void open(const std::string& path);
  /// Opens the default embedded sample and waits until the window shows it.
  void openSample();
  /// Draws every view now.
  void flushViews();

  std::unique_ptr<MainWindow> window_;

 private:
  const char* app_;
  QSize size_;
};

}  // namespace batchlens::ui::test_support
