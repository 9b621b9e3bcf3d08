// SPDX-License-Identifier: Apache-2.0
// batchlens: the desktop explorer. Wires the Qt application to the main window.
#include <cstdio>

#include <QApplication>
#include <QCommandLineParser>
#include <QIcon>
#include <QMessageBox>
#include <QTabWidget>
#include <QTimer>

#include "core/base/atomic_file.h"
#include "core/base/switches.h"
#include "core/base/system_info.h"
#include "core/base/version.h"
#include "ui/controllers.h"
#include "ui/main_window.h"
#include "ui/report_export.h"

int main(int argc, char** argv) {
  using namespace batchlens;
  // A SIGINT or SIGTERM while a file or report folder is being written removes its temporary
  // and exits 130 / 143: no half file is ever left under the name the user chose.
  base::install_signal_cleanup();
  QApplication app(argc, argv);
  QApplication::setOrganizationName(QStringLiteral("BatchLens"));
  QApplication::setApplicationName(QStringLiteral("BatchLens"));
  QApplication::setApplicationVersion(QString::fromStdString(base::build_info().tool_version));
  QApplication::setWindowIcon(QIcon(QStringLiteral(":/icons/batchlens.svg")));
  QApplication::setDesktopFileName(QStringLiteral("io.github.batchlens.BatchLens"));

  QCommandLineParser parser;
  parser.setApplicationDescription(QStringLiteral(
      "Explains why DiffusionGemma generates different text when only the batch size changes.\n"
      "Without FILE it opens the embedded sample experiment (DiffusionGemma mid, recorded on "
      "an H200)."));
  parser.addHelpOption();
  parser.addVersionOption();
  parser.addPositionalArgument(QStringLiteral("FILE"),
                               QStringLiteral("An experiment file (.h5) to open."));
  const QCommandLineOption screenshot(
      QStringList{QStringLiteral("screenshot")},
      QStringLiteral("Once the experiment is shown, render the main window to PNG <file> and exit "
                     "(documentation, checks)."),
      QStringLiteral("file"));
  const QCommandLineOption tab(QStringList{QStringLiteral("tab")},
                               QStringLiteral("Start on explorer tab <index> (0 = Overview)."),
                               QStringLiteral("index"));
  const QCommandLineOption comparison(
      QStringList{QStringLiteral("comparison")},
      QStringLiteral("Show comparison <id> (e.g. ref__b4) instead of the first that diverges."),
      QStringLiteral("id"));
  const QCommandLineOption tap(QStringList{QStringLiteral("tap")},
                               QStringLiteral("Show tap <name> (e.g. layer.out) in the heatmaps."),
                               QStringLiteral("name"));
  const QCommandLineOption report(
      QStringList{QStringLiteral("export-report")},
      QStringLiteral("Once the experiment is shown, write its report (PNGs of every view, "
                     "summary.md, summary.json) into folder <dir> and exit. Works headless with "
                     "QT_QPA_PLATFORM=offscreen."),
      QStringLiteral("dir"));
  parser.addOption(screenshot);
  parser.addOption(report);
  parser.addOption(tab);
  parser.addOption(tap);
  parser.addOption(comparison);
  parser.process(app);
  if (parser.isSet(report)) {
    // Refused before the experiment is read: a report never mixes into a folder with files.
    if (auto ok = ui::checkReportFolder(parser.value(report)); !ok.ok()) {
      std::fprintf(stderr, "batchlens: %s\n", ok.error().message.c_str());
      return 2;
    }
  }

  base::configure_threads(0);
  auto system = base::query_system_info();
  if (!system.ok()) {
    QMessageBox::critical(nullptr, QStringLiteral("BatchLens"),
                          QStringLiteral("Could not query this machine: %1")
                              .arg(QString::fromStdString(system.error().message)));
    return 1;
  }

  ui::MainWindow window(std::move(system).value());
  // The program's edge: fused kernels and CUDA graphs as the environment sets them.
  window.runController()->setSwitches(base::Switches::from_environment());
  window.show();

  QObject::connect(&window, &ui::MainWindow::documentShown, &window, [&] {
    if (parser.isSet(comparison)) {
      window.state()->setComparison(parser.value(comparison));
    }
    if (parser.isSet(tap)) {
      window.state()->setTap(window.state()->tapNames().indexOf(parser.value(tap)));
    }
    if (parser.isSet(tab)) {
      window.tabs()->setCurrentIndex(parser.value(tab).toInt());
    }
  });
  if (parser.isSet(screenshot)) {
    const QString path = parser.value(screenshot);
    const auto shoot = [&window, path] {
      const bool saved = window.grab().save(path, "PNG");
      QApplication::exit(saved ? 0 : 1);
    };
    // After the document is shown and the views have redrawn; an error dialog counts too.
    QObject::connect(&window, &ui::MainWindow::documentShown, &window,
                     [&window, shoot] { QTimer::singleShot(800, &window, shoot); });
    QObject::connect(&window, &ui::MainWindow::errorShown, &window,
                     [&window, shoot] { QTimer::singleShot(300, &window, shoot); });
  }
  if (parser.isSet(report)) {
    const QString dir = parser.value(report);
    QObject::connect(&window, &ui::MainWindow::documentShown, &window, [&window, dir] {
      QTimer::singleShot(0, &window, [&window, dir] {
        auto written = window.exportReportTo(dir);
        if (!written.ok()) {
          std::fprintf(stderr, "batchlens: %s\n", written.error().message.c_str());
          QApplication::exit(1);
          return;
        }
        for (const QString& path : written.value()) {
          std::printf("%s\n", qPrintable(path));
        }
        QApplication::exit(0);
      });
    });
    QObject::connect(&window, &ui::MainWindow::errorShown, &window, [](const QString& message) {
      std::fprintf(stderr, "batchlens: %s\n", qPrintable(message));
      QApplication::exit(1);
    });
  }
  const QStringList files = parser.positionalArguments();
  if (files.isEmpty()) {
    window.openEmbeddedSample();
  } else {
    window.openFile(files.front());
  }
  return QApplication::exec();
}
