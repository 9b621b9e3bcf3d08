// SPDX-License-Identifier: Apache-2.0
// batchlens: the desktop explorer. Wires the Qt application to the main window.
#include <QApplication>
#include <QCommandLineParser>
#include <QIcon>
#include <QMessageBox>
#include <QTimer>

#include "core/base/system_info.h"
#include "core/base/version.h"
#include "ui/main_window.h"

int main(int argc, char** argv) {
  using namespace batchlens;
  QApplication app(argc, argv);
  QApplication::setOrganizationName(QStringLiteral("BatchLens"));
  QApplication::setApplicationName(QStringLiteral("BatchLens"));
  QApplication::setApplicationVersion(QString::fromStdString(base::build_info().tool_version));
  QApplication::setWindowIcon(QIcon(QStringLiteral(":/icons/batchlens.svg")));
  QApplication::setDesktopFileName(QStringLiteral("io.github.batchlens.BatchLens"));

  QCommandLineParser parser;
  parser.setApplicationDescription(QStringLiteral(
      "Explains why DiffusionGemma generates different text when only the batch size changes."));
  parser.addHelpOption();
  parser.addVersionOption();
  const QCommandLineOption screenshot(
      QStringList{QStringLiteral("screenshot")},
      QStringLiteral("Render the main window to PNG <file> and exit (documentation, checks)."),
      QStringLiteral("file"));
  parser.addOption(screenshot);
  parser.process(app);

  base::configure_threads(0);
  auto system = base::query_system_info();
  if (!system.ok()) {
    QMessageBox::critical(nullptr, QStringLiteral("BatchLens"),
                          QStringLiteral("Could not query this machine: %1")
                              .arg(QString::fromStdString(system.error().message)));
    return 1;
  }

  ui::MainWindow window(std::move(system).value());
  window.show();

  if (parser.isSet(screenshot)) {
    const QString path = parser.value(screenshot);
    QTimer::singleShot(300, &window, [&window, path] {
      const bool saved = window.grab().save(path, "PNG");
      QApplication::exit(saved ? 0 : 1);
    });
  }
  return QApplication::exec();
}
