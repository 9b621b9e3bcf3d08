// SPDX-License-Identifier: Apache-2.0
#include "ui/main_window.h"

#include <QAction>
#include <QApplication>
#include <QKeySequence>
#include <QLabel>
#include <QMenuBar>
#include <QMessageBox>
#include <QStatusBar>
#include <QTextBrowser>

#include "core/base/version.h"

namespace batchlens::ui {

namespace {

QString q(const std::string& s) {
  return QString::fromStdString(s);
}

QString cudaSummary(const base::SystemInfo& system) {
  if (!system.cuda_build) {
    return QObject::tr("CUDA: not in this build");
  }
  if (system.gpus.empty()) {
    return QObject::tr("CUDA: no GPU visible");
  }
  QStringList names;
  for (const auto& gpu : system.gpus) {
    names << QStringLiteral("cuda:%1 %2").arg(gpu.index).arg(q(gpu.name));
  }
  return names.join(QStringLiteral(", "));
}

// The CUDA row of the start page: versions, or why there is no CUDA.
QString cudaDetail(const base::SystemInfo& system) {
  if (!system.cuda_build) {
    return QObject::tr("not in this build (LibTorch without CUDA)");
  }
  const auto version = [](int v) {
    return QStringLiteral("%1.%2").arg(v / 1000).arg((v % 1000) / 10);
  };
  QString text = QObject::tr("runtime %1").arg(version(system.cuda_runtime_version));
  if (!system.gpu_driver.empty()) {
    text += QObject::tr(", NVIDIA driver %1").arg(q(system.gpu_driver));
  }
  if (!system.cublas_version.empty()) {
    text += QObject::tr(", cuBLAS %1").arg(q(system.cublas_version));
  }
  if (system.gpus.empty()) {
    text += QObject::tr(", no GPU visible");
  }
  return text;
}

}  // namespace

QString environmentHtml(const base::SystemInfo& system) {
  const base::BuildInfo& build = base::build_info();
  QString html;
  html += QStringLiteral("<h2>BatchLens %1</h2>").arg(q(build.tool_version).toHtmlEscaped());
  html += QObject::tr(
      "<p>Why does DiffusionGemma's generated text change when only the batch size changes? "
      "BatchLens runs or loads paired batch-size experiments and shows where, when and in "
      "which op row 0 of a batch departs from the batch-1 reference.</p>");
  html += QStringLiteral("<table cellspacing='4'>");
  const auto row = [&html](const QString& key, const QString& value) {
    html += QStringLiteral("<tr><td><b>%1</b></td><td>%2</td></tr>")
                .arg(key.toHtmlEscaped(), value.toHtmlEscaped());
  };
  row(QObject::tr("Build"), QStringLiteral("git %1, %2, %3")
                                .arg(q(build.git_hash), q(build.build_type), q(build.compiler)));
  row(QObject::tr("LibTorch"), QStringLiteral("%1 (CPU BLAS %2, oneDNN %3)")
                                   .arg(q(system.libtorch_version), q(system.blas),
                                        system.mkldnn ? QObject::tr("yes") : QObject::tr("no")));
  row(QObject::tr("Host"), QStringLiteral("%1, %2").arg(q(system.host), q(system.os)));
  row(QObject::tr("CPU"), QObject::tr("%1, %2 hardware threads, %3 LibTorch threads")
                              .arg(q(system.cpu_model))
                              .arg(system.hardware_threads)
                              .arg(system.torch_threads));
  row(QObject::tr("CUDA"), cudaDetail(system));
  for (const auto& gpu : system.gpus) {
    row(QStringLiteral("cuda:%1").arg(gpu.index),
        QObject::tr("%1, %2 GiB, compute %3.%4")
            .arg(q(gpu.name))
            .arg(static_cast<double>(gpu.total_memory) / (1024.0 * 1024.0 * 1024.0), 0, 'f', 1)
            .arg(gpu.compute_major)
            .arg(gpu.compute_minor));
  }
  html += QStringLiteral("</table>");
  return html;
}

MainWindow::MainWindow(base::SystemInfo system, QWidget* parent)
    : QMainWindow(parent), system_(std::move(system)) {
  setWindowTitle(tr("BatchLens"));
  setObjectName(QStringLiteral("MainWindow"));
  resize(1200, 800);

  start_page_ = new QTextBrowser(this);
  start_page_->setObjectName(QStringLiteral("StartPage"));
  start_page_->setOpenExternalLinks(false);
  start_page_->setHtml(environmentHtml(system_));
  setCentralWidget(start_page_);

  environment_label_ = new QLabel(environmentSummary(), this);
  environment_label_->setObjectName(QStringLiteral("EnvironmentLabel"));
  statusBar()->addPermanentWidget(environment_label_);

  buildMenus();
}

QString MainWindow::environmentSummary() const {
  return tr("LibTorch %1 · CPU %2 threads · %3")
      .arg(q(system_.libtorch_version))
      .arg(system_.torch_threads)
      .arg(cudaSummary(system_));
}

void MainWindow::buildMenus() {
  QMenu* file = menuBar()->addMenu(tr("&File"));
  QAction* quit = file->addAction(tr("&Quit"));
  quit->setShortcut(QKeySequence::Quit);
  quit->setMenuRole(QAction::QuitRole);
  connect(quit, &QAction::triggered, this, &QWidget::close);

  QMenu* help = menuBar()->addMenu(tr("&Help"));
  QAction* about = help->addAction(tr("&About BatchLens"));
  about->setMenuRole(QAction::AboutRole);
  connect(about, &QAction::triggered, this, &MainWindow::showAbout);
  QAction* about_qt = help->addAction(tr("About &Qt"));
  connect(about_qt, &QAction::triggered, qApp, &QApplication::aboutQt);
}

void MainWindow::showAbout() {
  QMessageBox::about(this, tr("About BatchLens"), environmentHtml(system_));
}

}  // namespace batchlens::ui
