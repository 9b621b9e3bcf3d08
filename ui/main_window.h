// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <QMainWindow>

#include "core/base/system_info.h"

class QLabel;
class QTextBrowser;

namespace batchlens::ui {

/// The BatchLens main window. Lives on the GUI thread; composes the panels and menus and owns
/// nothing else. The explorer views are added by their own panels.
class MainWindow : public QMainWindow {
  Q_OBJECT

 public:
  /// `system` is shown in the status bar, the start page and Help > About.
  explicit MainWindow(base::SystemInfo system, QWidget* parent = nullptr);

  /// The one-line environment summary shown in the status bar, e.g.
  /// "LibTorch 1.13.0 · CPU 2 threads · CUDA: not in this build".
  QString environmentSummary() const;

 private:
  void buildMenus();
  void showAbout();

  base::SystemInfo system_;
  QTextBrowser* start_page_ = nullptr;
  QLabel* environment_label_ = nullptr;
};

/// The start page's HTML for a system: the build, LibTorch and the devices.
QString environmentHtml(const base::SystemInfo& system);

}  // namespace batchlens::ui
