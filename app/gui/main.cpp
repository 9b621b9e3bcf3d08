// SPDX-License-Identifier: Apache-2.0
// batchlens: the desktop explorer. Wires the Qt application to the main window.
#include <cstdio>
#include <memory>
#include <string_view>

#include <QApplication>
#include <QCommandLineParser>
#include <QCoreApplication>
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

namespace {

// The command line, declared once for the help-only path and the GUI.
struct Options {
  QCommandLineOption screenshot{
      QStringList{QStringLiteral("screenshot")},
      QStringLiteral("Once the experiment is shown, render the main window to PNG <file> and exit "
                     "(documentation, checks)."),
      QStringLiteral("file")};
  QCommandLineOption tab{QStringList{QStringLiteral("tab")},
                         QStringLiteral("Start on explorer tab <index> (0 = Overview)."),
                         QStringLiteral("index")};
  QCommandLineOption comparison{
      QStringList{QStringLiteral("comparison")},
      QStringLiteral("Show comparison <id> (e.g. ref__b4) instead of the first that diverges."),
      QStringLiteral("id")};
  QCommandLineOption tap{QStringList{QStringLiteral("tap")},
                         QStringLiteral("Show tap <name> (e.g. layer.out) in the heatmaps."),
                         QStringLiteral("name")};
  QCommandLineOption report{
      QStringList{QStringLiteral("export-report")},
      QStringLiteral("Once the experiment is shown, write its report (PNGs of every view, "
                     "summary.md, summary.json) into folder <dir> and exit. Works headless with "
                     "QT_QPA_PLATFORM=offscreen."),
      QStringLiteral("dir")};
  QCommandLineOption run{
      QStringList{QStringLiteral("run")},
      QStringLiteral("Once the experiment is shown, click Run with the run panel's settings (the "
                     "one-click demo on a fresh profile); with --screenshot, shoot when the run "
                     "has finished.")};
  QCommandLineOption shoot_after{
      QStringList{QStringLiteral("screenshot-after")},
      QStringLiteral("With --run and --screenshot: shoot <ms> milliseconds after Run instead, "
                     "during the run."),
      QStringLiteral("ms")};

  explicit Options(QCommandLineParser& parser) {
    parser.setApplicationDescription(QStringLiteral(
        "Explains why DiffusionGemma generates different text when only the batch size "
        "changes.\nWithout FILE it opens the embedded sample experiment (DiffusionGemma mid, "
        "recorded on an H200)."));
    parser.addHelpOption();
    parser.addVersionOption();
    parser.addPositionalArgument(QStringLiteral("FILE"),
                                 QStringLiteral("An experiment file (.h5) to open."));
    for (const QCommandLineOption* o :
         {&screenshot, &report, &tab, &tap, &comparison, &run, &shoot_after}) {
      parser.addOption(*o);
    }
  }
};

void set_application_names() {
  QCoreApplication::setOrganizationName(QStringLiteral("BatchLens"));
  QCoreApplication::setApplicationName(QStringLiteral("BatchLens"));
  QCoreApplication::setApplicationVersion(
      QString::fromStdString(batchlens::base::build_info().tool_version));
}

// True when the command line asks only for help or the version: answered without a display.
bool help_or_version(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a(argv[i]);
    if (a == "--") {
      return false;
    }
    if (a == "-h" || a == "--help" || a == "--help-all" || a == "-?" || a == "-v" ||
        a == "--version") {
      return true;
    }
  }
  return false;
}

}  // namespace

// An exception escaping Qt's event loop ends the program as in any Qt program (std::terminate
// names it); every expected failure is an Error shown in a dialog or printed.
int main(int argc, char** argv) {  // NOLINT(bugprone-exception-escape)
  using namespace batchlens;
  // A SIGINT or SIGTERM while a file or report folder is being written removes its temporary
  // and exits 130 / 143: no half file is ever left under the name the user chose.
  base::install_signal_cleanup();
  if (help_or_version(argc, argv)) {
    // No QApplication: it would need a display (and abort without one) just to print text.
    QCoreApplication core(argc, argv);
    set_application_names();
    QCommandLineParser parser;
    const Options options(parser);
    parser.process(core);  // prints and exits
    return 0;
  }
  QApplication app(argc, argv);
  set_application_names();
  QApplication::setWindowIcon(QIcon(QStringLiteral(":/icons/batchlens.svg")));
  QApplication::setDesktopFileName(QStringLiteral("io.github.batchlens.BatchLens"));

  QCommandLineParser parser;
  const Options options(parser);
  const QCommandLineOption& screenshot = options.screenshot;
  const QCommandLineOption& tab = options.tab;
  const QCommandLineOption& comparison = options.comparison;
  const QCommandLineOption& tap = options.tap;
  const QCommandLineOption& report = options.report;
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
  QObject::connect(&window, &ui::MainWindow::sweepShown, &window, [&] {
    if (parser.isSet(tab)) {
      window.tabs()->setCurrentIndex(parser.value(tab).toInt());
    }
  });
  const bool run = parser.isSet(options.run);
  if (run) {
    // The one-click demo: Run once the first document is shown, as a user would.
    auto clicked = std::make_shared<bool>(false);
    QObject::connect(&window, &ui::MainWindow::documentShown, &window, [&window, clicked] {
      if (!*clicked) {
        *clicked = true;
        QTimer::singleShot(300, &window, [&window] { window.runFromPanel(); });
      }
    });
  }
  if (parser.isSet(screenshot)) {
    const QString path = parser.value(screenshot);
    const auto shoot = [&window, path] {
      const bool saved = window.grab().save(path, "PNG");
      QApplication::exit(saved ? 0 : 1);
    };
    if (run && parser.isSet(options.shoot_after)) {
      // During the run: a fixed time after Run.
      const int ms = parser.value(options.shoot_after).toInt();
      QObject::connect(window.runController(), &ui::RunController::started, &window,
                       [&window, shoot, ms] { QTimer::singleShot(ms, &window, shoot); });
    } else if (run) {
      // After the run: its result shown and redrawn (or its failure).
      QObject::connect(window.runController(), &ui::RunController::finished, &window,
                       [&window, shoot] { QTimer::singleShot(800, &window, shoot); });
      QObject::connect(window.runController(), &ui::RunController::failed, &window,
                       [&window, shoot] { QTimer::singleShot(300, &window, shoot); });
    } else {
      // After the document is shown and the views have redrawn; an error dialog counts too.
      QObject::connect(&window, &ui::MainWindow::documentShown, &window,
                       [&window, shoot] { QTimer::singleShot(800, &window, shoot); });
      QObject::connect(&window, &ui::MainWindow::sweepShown, &window,
                       [&window, shoot] { QTimer::singleShot(800, &window, shoot); });
      QObject::connect(&window, &ui::MainWindow::errorShown, &window,
                       [&window, shoot] { QTimer::singleShot(300, &window, shoot); });
    }
  }
  if (parser.isSet(report)) {
    const QString dir = parser.value(report);
    // An experiment's report or a sweep's (a sweep file never showed an experiment, and the
    // program waited forever: issue #32).
    const auto export_then = [&window, dir](bool sweep) {
      QTimer::singleShot(0, &window, [&window, dir, sweep] {
        auto written = sweep ? window.exportSweepReportTo(dir) : window.exportReportTo(dir);
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
    };
    QObject::connect(&window, &ui::MainWindow::documentShown, &window,
                     [export_then] { export_then(false); });
    QObject::connect(&window, &ui::MainWindow::sweepShown, &window,
                     [export_then] { export_then(true); });
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
