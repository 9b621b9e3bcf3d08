// SPDX-License-Identifier: Apache-2.0
#include "ui/main_window.h"

#include <algorithm>
#include <functional>
#include <map>
#include <string_view>

#include <QAbstractButton>
#include <QAction>
#include <QApplication>
#include <QClipboard>
#include <QCloseEvent>
#include <QComboBox>
#include <QDir>
#include <QDockWidget>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFileDialog>
#include <QFileInfo>
#include <QGuiApplication>
#include <QHBoxLayout>
#include <QKeySequence>
#include <QLabel>
#include <QMenuBar>
#include <QMessageBox>
#include <QMimeData>
#include <QProgressBar>
#include <QPushButton>
#include <QSettings>
#include <QStandardPaths>
#include <QStatusBar>
#include <QTabWidget>
#include <QTimer>
#include <QUrl>
#include <QVBoxLayout>

#include "core/base/version.h"
#include "core/experiment/plan.h"
#include "ui/app_filter.h"
#include "ui/controllers.h"
#include "ui/qt_text.h"
#include "ui/remote_targets.h"
#include "ui/report_export.h"
#include "ui/run_panel.h"
#include "ui/sweep_dialog.h"
#include "ui/sweep_view.h"
#include "ui/views.h"
#include "ui/workaround_flow.h"

namespace batchlens::ui {

namespace {

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

namespace {

constexpr int kMaxRecentFiles = 10;
constexpr const char* kRecentKey = "recentFiles";

bool isExperimentFile(const QUrl& url) {
  return url.isLocalFile() &&
         QFileInfo(url.toLocalFile()).suffix().compare(QStringLiteral("h5"), Qt::CaseInsensitive) ==
             0;
}

}  // namespace

MainWindow::MainWindow(base::SystemInfo system, QWidget* parent)
    : QMainWindow(parent), system_(std::move(system)) {
  setWindowTitle(tr("BatchLens"));
  setObjectName(QStringLiteral("MainWindow"));
  setAcceptDrops(true);
  resize(1500, 950);
  AppFilter::install();

  state_ = new ExplorerState(this);
  runs_ = new RunController(this);
  files_ = new FileController(this);

  // The panel scrolls its form itself and keeps Run, progress and ETA in view below it.
  run_panel_ = new RunPanel(system_, this);
  run_panel_->setMinimumWidth(380);
  auto* dock = new QDockWidget(tr("Run"), this);
  dock->setObjectName(QStringLiteral("RunDock"));
  dock->setWidget(run_panel_);
  dock->setFeatures(QDockWidget::DockWidgetMovable | QDockWidget::DockWidgetFloatable);
  addDockWidget(Qt::LeftDockWidgetArea, dock);

  buildCentre();

  environment_label_ = new QLabel(environmentSummary(), this);
  environment_label_->setObjectName(QStringLiteral("EnvironmentLabel"));
  document_label_ = new QLabel(tr("No experiment"), this);
  document_label_->setObjectName(QStringLiteral("DocumentLabel"));
  statusBar()->addWidget(document_label_, 1);
  loading_bar_ = new QProgressBar(this);
  loading_bar_->setObjectName(QStringLiteral("LoadingIndicator"));
  loading_bar_->setRange(0, 0);  // busy: no known end
  loading_bar_->setMaximumWidth(160);
  loading_bar_->setToolTip(tr("Loading an experiment file; the views show the previous one."));
  loading_bar_->hide();
  statusBar()->addPermanentWidget(loading_bar_);
  statusBar()->addPermanentWidget(environment_label_);

  buildMenus();
  connectControllers();

  QSettings settings;
  restoreGeometry(settings.value(QStringLiteral("window/geometry")).toByteArray());
  restoreState(settings.value(QStringLiteral("window/state")).toByteArray());
  run_panel_->setRemoteTargets(loadRemoteTargets(settings));
  run_panel_->restoreSettings(settings);
  tabs_->setCurrentIndex(settings.value(QStringLiteral("window/tab"), 0).toInt());
}

MainWindow::~MainWindow() {
  // Stop a run before the controllers (children) are destroyed; their destructors join.
  runs_->cancel();
}

QString MainWindow::environmentSummary() const {
  return tr("LibTorch %1 · CPU %2 threads · %3")
      .arg(q(system_.libtorch_version))
      .arg(system_.torch_threads)
      .arg(cudaSummary(system_));
}

void MainWindow::buildCentre() {
  picker_ = new QComboBox(this);
  picker_->setObjectName(QStringLiteral("ComparisonPicker"));
  picker_->setToolTip(
      tr("Which comparison the views show: the B=1 reference against row 0 of "
         "each batch size, the B=1 repeat (noise floor), the workaround runs"));
  picker_->setSizeAdjustPolicy(QComboBox::AdjustToContents);
  tabs_ = new QTabWidget(this);
  tabs_->setObjectName(QStringLiteral("ExplorerTabs"));
  overview_ = new OverviewView(state_, this);
  layer_step_ = new LayerStepView(state_, this);
  spread_ = new SpreadView(state_, this);
  text_diff_ = new TextDiffView(state_, this);
  routing_ = new RoutingView(state_, this);
  kernels_ = new KernelsView(state_, this);
  sweep_ = new SweepView(this);
  connect(sweep_, &SweepView::itemActivated, this, &MainWindow::openSweepItem);
  connect(sweep_, &SweepView::sampleRequested, this,
          [this] { openEmbeddedSample(FileController::embeddedSweepSamplePath()); });
  // The culprit line's "use as workaround": the finder's fix into the op list, one click.
  connect(overview_, &OverviewView::culpritFixRequested, this, [this] {
    const auto* r = state_->result();
    if (r != nullptr && r->culprit && r->culprit->found) {
      run_panel_->showWorkaroundPolicy(r->culprit->fix);
      statusBar()->showMessage(tr("Workaround op list: %1").arg(q(ops::describe(r->culprit->fix))),
                               8000);
    }
  });
  // The tabs, each with the part of the story it shows: a headline clause opens its view (its
  // cell already selected).
  struct Tab {
    QWidget* view;
    QString title;
    analysis::StoryView story;
  };
  std::map<analysis::StoryView, QWidget*> story_tabs;
  for (const Tab& tab : {Tab{overview_, tr("Overview"), analysis::StoryView::Overview},
                         Tab{layer_step_, tr("Layer × Step"), analysis::StoryView::LayerStep},
                         Tab{spread_, tr("Canvas spread"), analysis::StoryView::Spread},
                         Tab{text_diff_, tr("Text diff"), analysis::StoryView::TextDiff},
                         Tab{routing_, tr("Routing"), analysis::StoryView::Routing},
                         Tab{kernels_, tr("Kernels"), analysis::StoryView::Kernels}}) {
    tabs_->addTab(tab.view, tab.title);
    story_tabs.emplace(tab.story, tab.view);
  }
  // Sweeps (issue #19) are documents of their own: a tab that an experiment does not change.
  tabs_->addTab(sweep_, tr("Sweep"));
  connect(tabs_, &QTabWidget::currentChanged, this, [this] { updateTitle(); });
  tabs_->setTabToolTip(tabs_->indexOf(sweep_),
                       tr("How often the batch size changes the text across prompts and seeds: "
                          "open a sweep file (batchlens-cli sweep)"));
  connect(overview_, &OverviewView::viewRequested, this, [this, story_tabs](int view) {
    const auto it = story_tabs.find(static_cast<analysis::StoryView>(view));
    tabs_->setCurrentWidget(it != story_tabs.end() ? it->second : overview_);
  });

  auto* top = new QHBoxLayout;
  top->addWidget(new QLabel(tr("Comparison:"), this));
  top->addWidget(picker_);
  top->addStretch(1);
  auto* centre = new QWidget(this);
  auto* layout = new QVBoxLayout(centre);
  layout->addLayout(top);
  layout->addWidget(tabs_, 1);
  setCentralWidget(centre);

  connect(picker_, &QComboBox::currentIndexChanged, this, [this](int i) {
    if (i >= 0) {
      state_->setComparison(picker_->itemData(i).toString());
    }
  });
  connect(state_, &ExplorerState::comparisonChanged, this, [this] {
    const int i = picker_->findData(state_->comparisonId());
    if (i >= 0 && i != picker_->currentIndex()) {
      const QSignalBlocker block(picker_);
      picker_->setCurrentIndex(i);
    }
  });
}

void MainWindow::buildMenus() {
  QMenu* file = menuBar()->addMenu(tr("&File"));
  QAction* open = file->addAction(tr("&Open…"), this, &MainWindow::chooseOpen);
  open->setShortcut(QKeySequence::Open);
  QMenu* samples = file->addMenu(tr("Open &embedded sample"));
  for (const auto& [resource, label] : FileController::embeddedSamples()) {
    samples->addAction(label, this, [this, path = resource] { openEmbeddedSample(path); });
  }
  recent_menu_ = file->addMenu(tr("Open &recent"));
  rebuildRecentMenu();
  file->addSeparator();
  QAction* save = file->addAction(tr("&Save as…"), this, &MainWindow::chooseSaveAs);
  save->setShortcut(QKeySequence::SaveAs);
  QAction* report = file->addAction(tr("&Export report…"), this, &MainWindow::chooseExport);
  report->setShortcut(QKeySequence(QStringLiteral("Ctrl+E")));
  QAction* repro =
      file->addAction(tr("Export minimal &repro…"), this, &MainWindow::chooseExportRepro);
  repro->setObjectName(QStringLiteral("ExportRepro"));
  repro->setToolTip(
      tr("A folder a maintainer runs with plain PyTorch: the first divergent op of the selected "
         "comparison at batch 1 and with the row repeated to B (repro.py), its captured row-0 "
         "inputs (inputs.safetensors), and a README with the kernels seen and the commands. "
         "Loads the model again and runs the B=1 reference to that step."));
  file->addSeparator();
  QAction* quit = file->addAction(tr("&Quit"));
  quit->setShortcut(QKeySequence::Quit);
  quit->setMenuRole(QAction::QuitRole);
  connect(quit, &QAction::triggered, this, &QWidget::close);

  QMenu* run = menuBar()->addMenu(tr("&Run"));
  run->addAction(tr("&Run experiment"), this, &MainWindow::runFromPanel);
  QAction* culprit = run->addAction(tr("Find c&ulprit"), this, &MainWindow::findCulprit);
  culprit->setObjectName(QStringLiteral("FindCulprit"));
  culprit->setToolTip(
      tr("With the run panel's settings: find the op families that, at least, must be fixed "
         "(by the workaround's strategy: row-wise or batch-invariant) for every batch size to "
         "be bitwise B=1's, then measure the fix's cost"));
  QAction* sweep = run->addAction(tr("Run s&weep…"), this, [this] { chooseSweep(); });
  sweep->setObjectName(QStringLiteral("RunSweep"));
  sweep->setToolTip(
      tr("The run panel's experiment over a prompts file × seeds (here, on its SSH target, or "
         "as a Slurm job array there): how often the batch size changes the text"));
  run->addAction(tr("&Cancel run"), runs_, &RunController::cancel);
  run->addAction(tr("&Use this experiment's settings"), this, [this] {
    if (state_->result() != nullptr) {
      run_panel_->setExperiment(*state_->result());
    }
  });
  QAction* command = run->addAction(tr("Copy &command for a GPU server"), this, [this] {
    if (state_->result() == nullptr) {
      showError(tr("Nothing to copy"), tr("Open or run an experiment first."));
      return;
    }
    const QString text =
        serverCommand(*state_->result(), run_panel_->workaroundPolicy(), documentStem());
    QGuiApplication::clipboard()->setText(text);
    statusBar()->showMessage(tr("Copied: %1").arg(text), 8000);
  });
  command->setToolTip(
      tr("The batchlens-cli command that runs the shown experiment, with the workaround's op "
         "list, on the machine it came from"));

  QMenu* help = menuBar()->addMenu(tr("&Help"));
  QAction* about = help->addAction(tr("&About BatchLens"));
  about->setMenuRole(QAction::AboutRole);
  connect(about, &QAction::triggered, this, &MainWindow::showAbout);
  QAction* about_qt = help->addAction(tr("About &Qt"));
  connect(about_qt, &QAction::triggered, qApp, &QApplication::aboutQt);
}

void MainWindow::connectControllers() {
  connect(run_panel_, &RunPanel::runRequested, this, &MainWindow::startPanelRun);
  connect(run_panel_, &RunPanel::targetsRequested, this, &MainWindow::editRemoteTargets);
  connect(run_panel_, &RunPanel::cancelRequested, runs_, &RunController::cancel);
  connect(run_panel_, &RunPanel::workaroundToggled, this, &MainWindow::onWorkaroundToggled);
  connect(runs_, &RunController::started, this, [this] {
    run_clock_.start();
    run_panel_->setRunning(true);
  });
  connect(runs_, &RunController::progressChanged, run_panel_, &RunPanel::showProgress);
  connect(runs_, &RunController::finished, this, [this](const ExperimentDocument& doc) {
    restore_workaround_.reset();
    run_panel_->setRunning(false);
    if (!runs_->workaroundRun() && runs_->remoteName().isEmpty() && doc.result != nullptr) {
      // What a decoder step cost here: the next estimates use it.
      RunPanel::recordMeasuredCost(*doc.result);
    }
    // Wall time from Run to the result, model build and kernel recording included.
    const double took =
        run_clock_.isValid() ? static_cast<double>(run_clock_.elapsed()) / 1000.0 : -1.0;
    last_run_seconds_ = took;
    run_panel_->showMessage(tr("Finished in %1: %2").arg(formatDuration(took), doc.origin));
    showDocument(doc);
  });
  connect(runs_, &RunController::reproExported, this,
          [this](const QString& summary, const QString& dir) {
            run_panel_->setRunning(false);
            run_panel_->showMessage(tr("Minimal repro written to %1").arg(dir));
            // Non-modal, as showError: the window (and tests) keep working.
            auto* box = new QMessageBox(QMessageBox::Information, tr("Minimal repro exported"),
                                        tr("Wrote %1").arg(dir), QMessageBox::Ok, this);
            box->setObjectName(QStringLiteral("ReproDialog"));
            box->setDetailedText(summary);
            box->setInformativeText(summary.section(QLatin1Char('\n'), 0, 1));
            box->setAttribute(Qt::WA_DeleteOnClose);
            box->setModal(false);
            box->show();
            Q_EMIT reproExported(dir);
          });
  connect(runs_, &RunController::reproFailed, this, [this](const QString& message) {
    run_panel_->setRunning(false);
    run_panel_->showMessage(tr("Repro export failed: %1").arg(message));
    showError(tr("Could not export the repro"), message);
  });
  connect(runs_, &RunController::cancelled, this, [this] {
    run_panel_->setRunning(false);
    restoreWorkaroundToggle();
    run_panel_->showMessage(
        runs_->cancelNote().isEmpty()
            ? tr("Cancelled. The experiment shown is unchanged.")
            : tr("Cancelled (%1). The experiment shown is unchanged.").arg(runs_->cancelNote()));
  });
  connect(runs_, &RunController::sweepFinished, this,
          [this](const QString& path, const QString& summary) {
            run_panel_->setRunning(false);
            const double took =
                run_clock_.isValid() ? static_cast<double>(run_clock_.elapsed()) / 1000.0 : -1.0;
            run_panel_->showMessage(
                tr("Sweep finished in %1: %2; its file %3")
                    .arg(formatDuration(took), summary.section(QLatin1Char('\n'), 0, 0), path));
            openFile(path);  // the Sweep tab shows it (sweepShown)
          });
  connect(runs_, &RunController::failed, this, [this](const QString& message) {
    run_panel_->setRunning(false);
    restoreWorkaroundToggle();
    run_panel_->showMessage(tr("Failed: %1").arg(message));
    showError(
        runs_->sweepRun() ? tr("The sweep could not run") : tr("The experiment could not run"),
        message);
  });
  connect(files_, &FileController::opened, this, [this](const ExperimentDocument& doc) {
    setLoading(-1);
    if (!doc.path.isEmpty()) {
      addRecentFile(doc.path);
    }
    showDocument(doc);
  });
  connect(files_, &FileController::sweepOpened, this, [this](const SweepDocument& doc) {
    setLoading(-1);
    if (!doc.path.isEmpty()) {
      addRecentFile(doc.path);
    }
    sweep_->setSweep(doc);
    tabs_->setCurrentWidget(sweep_);
    updateTitle();
    statusBar()->showMessage(tr("Sweep %1: %2 of %3 items")
                                 .arg(q(doc.sweep->id))
                                 .arg(doc.sweep->items_done)
                                 .arg(doc.sweep->items_total),
                             8000);
    Q_EMIT sweepShown();
  });
  connect(files_, &FileController::openFailed, this,
          [this](const QString& path, const QString& message) {
            setLoading(-1);
            showError(tr("Could not open %1").arg(QFileInfo(path).fileName()),
                      tr("%1\n\n%2").arg(path, message));
            // Nothing shown yet (a bad file on the command line): the embedded sample rather
            // than an empty window; the error stays on screen (issue #34).
            if (state_->result() == nullptr && sweep_->document().sweep == nullptr &&
                !path.startsWith(QStringLiteral(":/samples/"))) {
              openEmbeddedSample();
            }
          });
  connect(files_, &FileController::saved, this, [this](const QString& path) {
    const auto written = takeSave(path);
    addRecentFile(path);
    statusBar()->showMessage(tr("Saved %1").arg(path), 5000);
    // Another document may be shown by now: only the one written becomes "saved".
    if (written == nullptr || written != state_->document().result) {
      return;
    }
    state_->setPath(path);
    state_->setModified(false);
    updateTitle();
    if (close_after_save_) {
      close_after_save_ = false;
      QTimer::singleShot(0, this, &QWidget::close);
    }
  });
  connect(files_, &FileController::saveFailed, this,
          [this](const QString& path, const QString& message) {
            const auto failed = takeSave(path);
            close_after_save_ = false;  // never close over a result that is not on disk
            showSaveError(path, message,
                          failed != nullptr && failed == state_->document().result &&
                              state_->document().modified);
          });
}

void MainWindow::openFile(const QString& path) {
  if (path.startsWith(QStringLiteral(":/samples/"))) {
    openEmbeddedSample(path);
    return;
  }
  document_label_->setText(tr("Opening %1…").arg(path));
  setLoading(+1);
  files_->open(path);
}

void MainWindow::openEmbeddedSample(const QString& resource) {
  document_label_->setText(tr("Opening the embedded sample…"));
  setLoading(+1);
  files_->openEmbeddedSample(resource.isEmpty() ? FileController::embeddedSamplePath() : resource);
}

void MainWindow::setLoading(int change) {
  loading_ = std::max(0, loading_ + change);
  // A busy bar while a file or sample loads (the 26B sample takes seconds), and the shown
  // experiment greyed out meanwhile: it is the previous one.
  loading_bar_->setVisible(loading_ > 0);
  tabs_->setEnabled(loading_ == 0);
  if (loading_ > 0) {
    QApplication::setOverrideCursor(Qt::BusyCursor);
    ++busy_cursors_;
  }
  while (loading_ == 0 && busy_cursors_ > 0) {
    QApplication::restoreOverrideCursor();
    --busy_cursors_;
  }
}

void MainWindow::saveTo(const QString& path) {
  if (state_->result() == nullptr) {
    showError(tr("Nothing to save"), tr("Open or run an experiment first."));
    return;
  }
  saves_.emplace_back(path, state_->document().result);
  files_->save(path, state_->document().result);
}

bool MainWindow::savingShown() const {
  return std::any_of(saves_.begin(), saves_.end(),
                     [this](const auto& save) { return save.second == state_->document().result; });
}

std::shared_ptr<const experiment::ExperimentResult> MainWindow::takeSave(const QString& path) {
  const auto it = std::find_if(saves_.begin(), saves_.end(),
                               [&path](const auto& save) { return save.first == path; });
  if (it == saves_.end()) {
    return nullptr;
  }
  auto result = it->second;
  saves_.erase(it);
  return result;
}

base::Result<QStringList> MainWindow::exportReportTo(const QString& dir) {
  return exportReport(dir, *state_,
                      {{QStringLiteral("overview"), overview_},
                       {QStringLiteral("layer_step"), layer_step_},
                       {QStringLiteral("canvas_spread"), spread_},
                       {QStringLiteral("text_diff"), text_diff_},
                       {QStringLiteral("routing"), routing_}});
}

base::Result<QStringList> MainWindow::exportSweepReportTo(const QString& dir) {
  return exportSweepReport(dir, *sweep_);
}

void MainWindow::runFromPanel() {
  auto spec = run_panel_->spec();
  if (!spec.ok()) {
    run_panel_->showMessage(tr("Cannot run: %1").arg(q(spec.error().message)));
    return;
  }
  startPanelRun(spec.value());
}

void MainWindow::startPanelRun(const experiment::ExperimentSpec& spec) {
  const std::optional<remote::SshTarget> target = run_panel_->remoteTarget();
  if (!target) {
    startRun(spec);
    return;
  }
  if (runs_->isRunning()) {
    run_panel_->showMessage(tr("A run is in progress: cancel it first."));
    return;
  }
  run_panel_->showMessage(
      tr("Running %1 on %2 over SSH…").arg(q(spec.model.describe()), q(target->describe())));
  runs_->startRemote(*target, spec);
}

void MainWindow::editRemoteTargets() {
  auto* dialog = new RemoteTargetsDialog(run_panel_->remoteTargets(), this);
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  connect(dialog, &QDialog::accepted, this, [this, dialog] {
    QSettings settings;
    saveRemoteTargets(settings, dialog->targets());
    run_panel_->setRemoteTargets(dialog->targets());
    statusBar()->showMessage(
        tr("%n SSH target(s); their devices are in the Run panel's device list", nullptr,
           static_cast<int>(dialog->targets().size())),
        8000);
  });
  dialog->open();
}

void MainWindow::findCulprit() {
  if (runs_->isRunning()) {
    run_panel_->showMessage(tr("A run is in progress: cancel it first."));
    return;
  }
  auto spec = run_panel_->spec();
  if (!spec.ok()) {
    run_panel_->showMessage(tr("Cannot run: %1").arg(q(spec.error().message)));
    return;
  }
  const ops::Strategy strategy = run_panel_->workaroundStrategy();
  if (const auto target = run_panel_->remoteTarget()) {
    run_panel_->showMessage(
        tr("Finding the culprit (%1) on %2 over SSH…")
            .arg(q(std::string(ops::strategy_name(strategy))), q(target->describe())));
    runs_->startRemote(*target, spec.value(), "culprit",
                       {"--strategy", std::string(ops::strategy_name(strategy))});
    return;
  }
  run_panel_->showMessage(
      tr("Finding the culprit (%1) on %2…")
          .arg(q(std::string(ops::strategy_name(strategy))), q(spec.value().model.describe())));
  runs_->startCulprit(spec.value(), strategy);
}

SweepDialog* MainWindow::chooseSweep() {
  if (runs_->isRunning()) {
    run_panel_->showMessage(tr("A run is in progress: cancel it first."));
    return nullptr;
  }
  auto spec = run_panel_->spec();
  if (!spec.ok()) {
    run_panel_->showMessage(tr("Cannot run a sweep: %1").arg(q(spec.error().message)));
    return nullptr;
  }
  const std::optional<remote::SshTarget> target = run_panel_->remoteTarget();
  const QString where =
      target ? tr("%1 on %2 over SSH").arg(run_panel_->device(), q(target->describe()))
             : tr("%1 here").arg(run_panel_->device());
  auto* dialog = new SweepDialog(spec.value(), where, target.has_value(), this);
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  connect(dialog, &QDialog::accepted, this, [this, dialog] {
    auto sweep = dialog->sweep();
    if (!sweep.ok()) {
      showError(tr("The sweep cannot run"), q(sweep.error().message));
      return;
    }
    runSweep(sweep.value(), dialog->slurm());
  });
  dialog->open();
  return dialog;
}

void MainWindow::runSweep(const analysis::SweepSpec& sweep,
                          const std::optional<remote::SlurmSubmit>& slurm) {
  if (runs_->isRunning()) {
    run_panel_->showMessage(tr("A run is in progress: cancel it first."));
    return;
  }
  const std::optional<remote::SshTarget> target = run_panel_->remoteTarget();
  const int items = static_cast<int>(analysis::sweep_items(sweep).size());
  run_panel_->showMessage(
      target ? (slurm ? tr("Submitting %n sweep item(s) to Slurm on %1…", nullptr, items)
                      : tr("Running %n sweep item(s) on %1 over SSH…", nullptr, items))
                   .arg(q(target->describe()))
             : tr("Running %n sweep item(s) here…", nullptr, items));
  runs_->startSweep(sweep, target, target ? slurm : std::nullopt);
}

void MainWindow::startRun(const experiment::ExperimentSpec& spec) {
  if (runs_->isRunning()) {
    run_panel_->showMessage(tr("A run is in progress: cancel it first."));
    return;
  }
  run_panel_->showMessage(tr("Running %1…").arg(q(spec.model.describe())));
  if (!runs_->start(spec)) {
    run_panel_->showMessage(tr("A run is in progress: cancel it first."));
  }
}

void MainWindow::openSweepItem(int item) {
  const QString kept = sweep_->keptExperiment(item);
  if (!kept.isEmpty()) {
    openFile(kept);
    return;
  }
  auto* box = new QMessageBox(QMessageBox::Question, tr("Re-run sweep item %1").arg(item),
                              tr("Item %1's experiment was not kept (batchlens-cli sweep "
                                 "--keep-experiments keeps them). Run it now as a full "
                                 "experiment, with every tap and kernel provenance? It runs "
                                 "here, on %2, with the sweep's model and settings.")
                                  .arg(item)
                                  .arg(q(sweep_->document().sweep->spec.base.load.device)),
                              QMessageBox::NoButton, this);
  box->setObjectName(QStringLiteral("SweepItemOffer"));
  box->setAttribute(Qt::WA_DeleteOnClose);
  box->addButton(tr("Run"), QMessageBox::AcceptRole);
  box->addButton(QMessageBox::Cancel);
  connect(box, &QMessageBox::accepted, this, [this, item] { rerunSweepItem(item); });
  box->open();
}

void MainWindow::rerunSweepItem(int item) {
  const auto& doc = sweep_->document();
  if (!doc.sweep) {
    return;
  }
  const auto items = analysis::sweep_items(doc.sweep->spec);
  if (item < 0 || item >= static_cast<int>(items.size())) {
    showError(tr("No such item"), tr("The sweep has %1 items.").arg(items.size()));
    return;
  }
  experiment::ExperimentSpec spec =
      analysis::item_spec(doc.sweep->spec, items[static_cast<std::size_t>(item)]);
  spec.kernels = true;  // a full experiment, as `batchlens-cli run` records it
  tabs_->setCurrentWidget(overview_);
  startRun(spec);
}

void MainWindow::onWorkaroundToggled(bool on) {
  state_->setShowWorkaround(on);
  if (!on) {
    return;
  }
  const auto* r = state_->result();
  const ops::OpPolicy workaround = run_panel_->workaroundPolicy();
  // The shown experiment already ran this workaround: show it beside, nothing to run.
  if (r != nullptr && r->spec.workaround && *r->spec.workaround == workaround) {
    return;
  }
  if (runs_->isRunning()) {
    run_panel_->showMessage(tr("The workaround applies to the next run."));
    return;
  }
  if (workaround.rules.empty()) {
    run_panel_->setWorkaroundEnabled(false);
    state_->setShowWorkaround(false);
    run_panel_->showMessage(tr("Check at least one op family for the workaround."));
    return;
  }
  if (r == nullptr) {
    startForToggle([this] { runFromPanel(); });
    return;
  }
  const QString blocker = workaroundBlocker(system_, *r);
  const int recorded_on =
      blocker.isEmpty()
          ? -1
          : targetRecordedOn(
                run_panel_->remoteTargets(), r->provenance.host,
                r->spec.load.device == "cpu" ? std::string() : r->provenance.device_name);
  if (recorded_on >= 0) {
    // Where it was recorded is an SSH target: the experiment runs again there, whole (its
    // settings and prompt ids, the workaround on), and the file comes back.
    const RemoteTarget& target = run_panel_->remoteTargets()[static_cast<std::size_t>(recorded_on)];
    experiment::ExperimentSpec spec = r->spec;
    spec.workaround = workaround;
    spec.prompt_ids = r->prompt_ids;
    run_panel_->showMessage(
        tr("%1 The experiment runs again with the workaround on %2, where it was recorded "
           "(host %3)…")
            .arg(blocker, target.name(), q(r->provenance.host)));
    startForToggle([this, ssh = target.ssh, spec] { runs_->startRemote(ssh, spec); });
    return;
  }
  if (!blocker.isEmpty()) {
    // Never something else in its place without saying so: the user chooses.
    run_panel_->setWorkaroundEnabled(false);
    state_->setShowWorkaround(false);
    offerWorkaroundElsewhere(*r, blocker, workaround);
    return;
  }
  std::size_t missing = 0;
  for (const auto& g : experiment::plan_groups([&] {
         auto spec = r->spec;
         spec.workaround = workaround;
         return spec;
       }())) {
    missing += g.group == experiment::RunGroup::Workaround ? g.runs.size() : 0;
  }
  run_panel_->showMessage(
      tr("Running only the %1 workaround runs, with the shown experiment's settings (%2)…")
          .arg(missing)
          .arg(q(r->spec.model.describe())));
  startForToggle([this, workaround] { runs_->startWorkaround(state_->document(), workaround); });
}

void MainWindow::startForToggle(const std::function<void()>& start) {
  restore_workaround_ = false;  // a cancelled or failed run leaves the toggle off again
  start();
  if (!runs_->isRunning()) {
    // Refused before it started (a form Run refuses, a run in progress): no cancel or failure
    // will come to restore the toggle, and none of a later run may.
    restoreWorkaroundToggle();
  }
}

void MainWindow::restoreWorkaroundToggle() {
  if (!restore_workaround_) {
    return;
  }
  run_panel_->setWorkaroundEnabled(*restore_workaround_);
  state_->setShowWorkaround(*restore_workaround_);
  restore_workaround_.reset();
}

QString MainWindow::documentStem() const {
  const auto& doc = state_->document();
  return doc.path.isEmpty() ? QStringLiteral("experiment") : QFileInfo(doc.path).completeBaseName();
}

QMessageBox* MainWindow::offerWorkaroundElsewhere(const experiment::ExperimentResult& shown,
                                                  const QString& reason,
                                                  const ops::OpPolicy& workaround) {
  bool exact = false;
  const ops::EmulationProfile& profile = profileStandingFor(shown.provenance, &exact);
  const QString command = serverCommand(shown, workaround, documentStem());
  // A CPU experiment runs here too, whole: its own settings and prompt ids, the workaround on.
  const bool cpu = shown.spec.load.device == "cpu";
  const QString ran_on = shown.provenance.device_name.empty() ? q(shown.spec.load.device)
                                                              : q(shown.provenance.device_name);
  auto* box = new QMessageBox(QMessageBox::Information, tr("The workaround cannot run here"),
                              tr("%1\n\nBatchLens will not run something else in its place "
                                 "without asking. You can:")
                                  .arg(reason),
                              QMessageBox::NoButton, this);
  box->setObjectName(QStringLiteral("WorkaroundElsewhereDialog"));
  box->setAttribute(Qt::WA_DeleteOnClose);
  box->setModal(false);
  const QString first =
      cpu ? tr("• run the whole experiment again here, with the workaround (its settings and "
               "prompt ids; a new experiment of this machine); or")
          : tr("• run the CPU demo with the %1 profile, an EMULATION of %2%3, with the "
               "workaround; or")
                .arg(q(profile.name), q(profile.gpu),
                     exact ? QString() : tr(" (no profile stands for this experiment's GPU)"));
  box->setInformativeText(
      tr("%1\n• run the shown experiment with the workaround where it was recorded (%2):\n\n%3")
          .arg(first, ran_on, command));
  box->setDetailedText(command);
  box->setTextInteractionFlags(Qt::TextSelectableByMouse);
  QPushButton* run = nullptr;
  if (cpu) {
    run = box->addButton(tr("Run it &again here"), QMessageBox::AcceptRole);
    run->setObjectName(QStringLiteral("RunHereButton"));
    connect(run, &QPushButton::clicked, this, [this, result = state_->document().result] {
      if (result != nullptr) {
        startFromOffer([this, result] { run_panel_->setExperiment(*result); });
      }
    });
  } else {
    run =
        box->addButton(tr("Run the CPU &demo (%1)").arg(q(profile.name)), QMessageBox::AcceptRole);
    run->setObjectName(QStringLiteral("RunDemoButton"));
    connect(run, &QPushButton::clicked, this, [this, profile_name = std::string(profile.name)] {
      startFromOffer([this, profile_name] {
        experiment::ExperimentSpec spec = defaultDemoSpec();
        spec.policy = ops::OpPolicy::emulation_profile(profile_name);
        run_panel_->setSpec(spec);
      });
    });
  }
  QPushButton* copy = box->addButton(tr("&Copy the command"), QMessageBox::ActionRole);
  copy->setObjectName(QStringLiteral("CopyCommandButton"));
  QPushButton* cancel = box->addButton(QMessageBox::Cancel);
  box->setDefaultButton(cancel);
  connect(copy, &QPushButton::clicked, this, [this, command] {
    QGuiApplication::clipboard()->setText(command);
    statusBar()->showMessage(tr("Copied: %1").arg(command), 8000);
  });
  box->show();
  run_panel_->showMessage(reason);
  Q_EMIT workaroundElsewhereOffered(command);
  return box;
}

void MainWindow::startFromOffer(const std::function<void()>& fill_panel) {
  // The dialog is not modal: a run may have started since it opened.
  if (runs_->isRunning()) {
    run_panel_->showMessage(tr("A run is in progress: cancel it first."));
    return;
  }
  fill_panel();
  run_panel_->setWorkaroundEnabled(true);
  state_->setShowWorkaround(true);
  startForToggle([this] { runFromPanel(); });
}

void MainWindow::showDocument(const ExperimentDocument& document) {
  close_after_save_ = false;
  state_->setDocument(document);
  const auto* r = state_->result();
  // The box ticks for a file with workaround runs, and the op list shows that workaround's ops:
  // never a tick beside another op list than the one the runs used (issue #34).
  if (r != nullptr && r->spec.workaround.has_value()) {
    run_panel_->showWorkaroundPolicy(*r->spec.workaround);
  }
  run_panel_->setWorkaroundEnabled(r != nullptr && r->spec.workaround.has_value());
  state_->setShowWorkaround(run_panel_->workaroundEnabled());
  refreshPicker();
  updateTitle();
  Q_EMIT documentShown();
}

void MainWindow::refreshPicker() {
  const QSignalBlocker block(picker_);
  picker_->clear();
  if (const auto* r = state_->result()) {
    for (const auto& c : r->comparisons) {
      picker_->addItem(comparisonLabel(*r, c), q(c.id));
    }
  }
  picker_->setCurrentIndex(picker_->findData(state_->comparisonId()));
}

void MainWindow::updateTitle() {
  if (document_label_ == nullptr) {
    return;  // still building the window
  }
  // The Sweep tab shows a document of its own: the title and status bar name it there.
  if (tabs_->currentWidget() == sweep_ && sweep_->document().sweep != nullptr) {
    const SweepDocument& sweep = sweep_->document();
    const QString path = sweep.path.isEmpty() ? tr("the embedded sweep sample") : sweep.path;
    setWindowTitle(
        tr("%1 — BatchLens").arg(sweep.path.isEmpty() ? path : QFileInfo(path).fileName()));
    setWindowModified(false);
    document_label_->setText(tr("Sweep %1 · %2 · %3 of %4 items")
                                 .arg(path, q(sweep.sweep->spec.base.model.describe()))
                                 .arg(sweep.sweep->items_done)
                                 .arg(sweep.sweep->items_total));
    return;
  }
  const auto& doc = state_->document();
  if (state_->result() == nullptr && doc.path.isEmpty() && doc.origin.isEmpty()) {
    setWindowTitle(tr("BatchLens"));
    document_label_->setText(tr("No experiment"));
    return;
  }
  const QString name = doc.path.isEmpty() ? doc.origin : QFileInfo(doc.path).fileName();
  setWindowTitle(tr("%1[*] — BatchLens").arg(name));
  setWindowModified(doc.modified);
  if (const auto* r = state_->result()) {
    document_label_->setText(
        tr("%1 · %2 on %3%4")
            .arg(doc.path.isEmpty() ? doc.origin : doc.path, q(r->spec.model.describe()),
                 q(r->provenance.device_name),
                 r->provenance.emulated ? tr(" · EMULATED split-K") : QString()));
  }
}

QMessageBox* MainWindow::showSaveError(const QString& path, const QString& message, bool unsaved) {
  last_error_ = message;
  auto* box = new QMessageBox(QMessageBox::Critical,
                              tr("Could not save %1").arg(QFileInfo(path).fileName()),
                              tr("Could not save the experiment to %1.\n\n%2").arg(path, message),
                              QMessageBox::Close, this);
  box->setObjectName(QStringLiteral("SaveErrorDialog"));
  box->setAttribute(Qt::WA_DeleteOnClose);
  box->setModal(false);
  if (unsaved) {
    // The run exists only in memory: say so, and offer the way out.
    box->setInformativeText(
        tr("The experiment is still open and not saved. Choose another place with Save As."));
    QPushButton* save_as = box->addButton(tr("Save &As…"), QMessageBox::AcceptRole);
    save_as->setObjectName(QStringLiteral("SaveAsButton"));
    box->setDefaultButton(save_as);
    connect(save_as, &QPushButton::clicked, this, [this] { chooseSaveAs(); });
  }
  box->show();
  statusBar()->showMessage(tr("Could not save %1").arg(path), 8000);
  Q_EMIT errorShown(message);
  return box;
}

void MainWindow::showError(const QString& title, const QString& message) {
  last_error_ = message;
  // Non-modal: the window keeps working (and tests keep running) while it is shown.
  auto* box = new QMessageBox(QMessageBox::Critical, title, message, QMessageBox::Ok, this);
  box->setObjectName(QStringLiteral("ErrorDialog"));
  box->setAttribute(Qt::WA_DeleteOnClose);
  box->setModal(false);
  box->show();
  statusBar()->showMessage(title, 8000);
  Q_EMIT errorShown(message);
}

QStringList MainWindow::recentFiles() {
  return QSettings().value(QLatin1String(kRecentKey)).toStringList();
}

void MainWindow::addRecentFile(const QString& path) {
  QStringList files = recentFiles();
  files.removeAll(path);
  files.prepend(path);
  while (files.size() > kMaxRecentFiles) {
    files.removeLast();
  }
  QSettings().setValue(QLatin1String(kRecentKey), files);
  rebuildRecentMenu();
}

void MainWindow::rebuildRecentMenu() {
  recent_menu_->clear();
  const QStringList files = recentFiles();
  for (const QString& path : files) {
    recent_menu_->addAction(path, this, [this, path] { openFile(path); });
  }
  recent_menu_->setEnabled(!files.isEmpty());
  if (!files.isEmpty()) {
    recent_menu_->addSeparator();
    recent_menu_->addAction(tr("Clear list"), this, [this] {
      QSettings().remove(QLatin1String(kRecentKey));
      rebuildRecentMenu();
    });
  }
}

void MainWindow::chooseOpen() {
  QSettings settings;
  const QString path = QFileDialog::getOpenFileName(
      this, tr("Open experiment"), settings.value(QStringLiteral("lastDir")).toString(),
      tr("BatchLens experiments (*.h5);;All files (*)"));
  if (!path.isEmpty()) {
    settings.setValue(QStringLiteral("lastDir"), QFileInfo(path).absolutePath());
    openFile(path);
  }
}

QString saveDialogDir(const QString& last_dir, const QString& document_path) {
  QStringList candidates;
  if (!document_path.isEmpty()) {
    candidates << QFileInfo(document_path).absolutePath();
  }
  candidates << last_dir << QStandardPaths::writableLocation(QStandardPaths::DocumentsLocation)
             << QDir::homePath() << QDir::currentPath() << QDir::tempPath();
  for (const QString& dir : candidates) {
    const QFileInfo info(dir);
    if (!dir.isEmpty() && info.isDir() && !QDir(info.absoluteFilePath()).isRoot()) {
      return QDir::cleanPath(info.absoluteFilePath());
    }
  }
  return QDir::tempPath();
}

bool MainWindow::chooseSaveAs() {
  if (state_->result() == nullptr) {
    showError(tr("Nothing to save"), tr("Open or run an experiment first."));
    return false;
  }
  QSettings settings;
  const auto& doc = state_->document();
  const QString dir = saveDialogDir(settings.value(QStringLiteral("lastDir")).toString(), doc.path);
  const QString name =
      doc.path.isEmpty() ? QStringLiteral("experiment.h5") : QFileInfo(doc.path).fileName();
  QString path = QFileDialog::getSaveFileName(
      this, tr("Save experiment as"), QDir(dir).filePath(name), tr("BatchLens experiments (*.h5)"));
  if (path.isEmpty()) {
    return false;
  }
  if (!path.endsWith(QStringLiteral(".h5"))) {
    path += QStringLiteral(".h5");
  }
  settings.setValue(QStringLiteral("lastDir"), QFileInfo(path).absolutePath());
  saveTo(path);
  return true;
}

bool MainWindow::exportReproTo(const QString& dir) {
  const auto* r = state_->result();
  if (r == nullptr) {
    showError(tr("Nothing to export"), tr("Open or run an experiment first."));
    return false;
  }
  if (runs_->isRunning()) {
    run_panel_->showMessage(tr("A run is in progress: cancel it first."));
    return false;
  }
  analysis::ReproRequest request;
  const experiment::ComparisonResult* c = r->comparison(state_->comparisonId().toStdString());
  if (c != nullptr && c->kind == experiment::ComparisonKind::Row0) {
    if (!c->first.found()) {
      showError(tr("Nothing to reproduce"),
                tr("Row 0 of %1 is bitwise equal to B=1 at every step: pick a comparison that "
                   "diverges.")
                    .arg(q(c->id)));
      return false;
    }
    request.comparison = c->id;
  }
  // Not reproducible here (another GPU, other kernels) but recorded on an SSH target's host:
  // exported there, where its GPU is.
  const int recorded_on =
      workaroundBlocker(system_, *r).isEmpty()
          ? -1
          : targetRecordedOn(
                run_panel_->remoteTargets(), r->provenance.host,
                r->spec.load.device == "cpu" ? std::string() : r->provenance.device_name);
  if (recorded_on >= 0) {
    const QString file = state_->document().path;
    if (file.isEmpty() || !QFileInfo(file).isFile() || state_->document().modified) {
      showError(
          tr("Save the experiment first"),
          tr("The repro is exported on %1, where the experiment was recorded: save the "
             "experiment to a file first, it travels there.")
              .arg(run_panel_->remoteTargets()[static_cast<std::size_t>(recorded_on)].name()));
      return false;
    }
    const RemoteTarget& target = run_panel_->remoteTargets()[static_cast<std::size_t>(recorded_on)];
    std::vector<std::string> args;
    if (!request.comparison.empty()) {
      args = {"--comparison", request.comparison};
    }
    run_panel_->showMessage(tr("Exporting a minimal repro on %1, where the experiment was "
                               "recorded: sending the file, loading %2 there…")
                                .arg(target.name(), q(r->spec.model.describe())));
    return runs_->startRemoteRepro(target.ssh, file, args, dir);
  }
  request.out = dir.toStdString();
  request.source_file = state_->document().path.toStdString();
  run_panel_->showMessage(tr("Exporting a minimal repro: loading %1 and running its B=1 "
                             "reference to the divergence…")
                              .arg(q(r->spec.model.describe())));
  return runs_->startRepro(state_->document().result, request);
}

void MainWindow::chooseExportRepro() {
  if (state_->result() == nullptr) {
    showError(tr("Nothing to export"), tr("Open or run an experiment first."));
    return;
  }
  const QString comparison =
      state_->comparisonId().isEmpty() ? QStringLiteral("first") : state_->comparisonId();
  const QString dir = chooseExportFolder(
      tr("Export minimal repro to folder"), [this, &comparison](const QString& parent) {
        return QDir(parent).filePath(documentStem() + QStringLiteral("-repro-") + comparison);
      });
  if (!dir.isEmpty()) {
    exportReproTo(dir);
  }
}

QString MainWindow::chooseExportFolder(const QString& title,
                                       const std::function<QString(const QString&)>& proposed) {
  // A folder that does not exist yet is the usual answer (the export creates it): a save
  // dialog, starting in the last export folder, proposing a new folder's name (issue #34).
  QSettings settings;
  const QString start = saveDialogDir(
      settings.value(QStringLiteral("exportDir"), settings.value(QStringLiteral("lastDir")))
          .toString(),
      QString());
  QString dir = QFileDialog::getSaveFileName(this, title, proposed(start), QString(), nullptr,
                                             QFileDialog::DontConfirmOverwrite);
  if (dir.isEmpty()) {
    return {};
  }
  if (QFileInfo(dir).isFile()) {
    showError(tr("Not a folder"),
              tr("%1 is a file. Give the name of a new or empty folder.").arg(dir));
    return {};
  }
  settings.setValue(QStringLiteral("exportDir"), QFileInfo(dir).absolutePath());
  return dir;
}

void MainWindow::chooseExport() {
  if (state_->result() == nullptr) {
    showError(tr("Nothing to export"), tr("Open or run an experiment first."));
    return;
  }
  QString dir = chooseExportFolder(tr("Export report to folder"), [this](const QString& parent) {
    return newReportFolder(parent, *state_);
  });
  if (dir.isEmpty()) {
    return;
  }
  // A report is a folder of its own: never mixed into one that holds other files.
  if (!checkReportFolder(dir).ok()) {
    const QString inside = newReportFolder(dir, *state_);
    const auto answer = QMessageBox::question(
        this, tr("Folder not empty"),
        tr("%1 is not empty. Write the report into a new folder inside it?\n\n%2").arg(dir, inside),
        QMessageBox::Yes | QMessageBox::Cancel, QMessageBox::Yes);
    if (answer != QMessageBox::Yes) {
      return;
    }
    dir = inside;
  }
  QApplication::setOverrideCursor(Qt::WaitCursor);
  auto written = exportReportTo(dir);
  QApplication::restoreOverrideCursor();
  if (!written.ok()) {
    showError(tr("Could not export the report"), q(written.error().message));
    return;
  }
  statusBar()->showMessage(
      tr("Report written: %1 files in %2").arg(written.value().size()).arg(dir), 8000);
}

void MainWindow::dragEnterEvent(QDragEnterEvent* event) {
  const auto urls = event->mimeData()->urls();
  if (std::any_of(urls.begin(), urls.end(), isExperimentFile)) {
    event->acceptProposedAction();
  }
}

void MainWindow::dropEvent(QDropEvent* event) {
  for (const QUrl& url : event->mimeData()->urls()) {
    if (isExperimentFile(url)) {
      openFile(url.toLocalFile());
      event->acceptProposedAction();
      return;  // one document at a time: the first experiment file dropped
    }
  }
}

void MainWindow::closeEvent(QCloseEvent* event) {
  // A run in progress is lost on close: ask first (issue #34), without blocking the run.
  if (runs_->isRunning() && !close_during_run_confirmed_) {
    event->ignore();
    for (const QMessageBox* open :
         findChildren<QMessageBox*>(QStringLiteral("CloseDuringRunDialog"))) {
      if (open->isVisible()) {
        return;  // already asking
      }
    }
    auto* box = new QMessageBox(QMessageBox::Question, tr("A run is in progress"),
                                tr("An experiment is running. Closing stops it, and what it "
                                   "computed so far is lost."),
                                QMessageBox::NoButton, this);
    box->setObjectName(QStringLiteral("CloseDuringRunDialog"));
    box->setAttribute(Qt::WA_DeleteOnClose);
    box->setModal(false);
    QPushButton* stop = box->addButton(tr("Stop the run and close"), QMessageBox::AcceptRole);
    stop->setObjectName(QStringLiteral("StopAndCloseButton"));
    box->addButton(tr("Keep running"), QMessageBox::RejectRole)
        ->setObjectName(QStringLiteral("KeepRunningButton"));
    box->setDefaultButton(qobject_cast<QPushButton*>(box->buttons().last()));
    connect(box, &QMessageBox::buttonClicked, this, [this, stop](QAbstractButton* clicked) {
      if (clicked == stop) {
        close_during_run_confirmed_ = true;
        close();
      }
    });
    box->show();
    return;
  }
  // A run's result exists only in memory until saved: offer to keep it.
  if (state_->document().modified && state_->result() != nullptr) {
    if (savingShown()) {
      close_after_save_ = true;
      statusBar()->showMessage(tr("Closing once the experiment is saved…"));
      event->ignore();
      return;
    }
    const auto answer = QMessageBox::question(
        this, tr("Unsaved experiment"),
        tr("The experiment from the %1 is not saved. Save it before closing?")
            .arg(state_->document().origin),
        QMessageBox::Save | QMessageBox::Discard | QMessageBox::Cancel, QMessageBox::Save);
    if (answer == QMessageBox::Cancel) {
      event->ignore();
      return;
    }
    if (answer == QMessageBox::Save) {
      // Stay open until the file is on disk: a failed save keeps the run and says why.
      event->ignore();
      close_after_save_ = chooseSaveAs();
      return;
    }
  }
  runs_->cancel();
  QSettings settings;
  settings.setValue(QStringLiteral("window/geometry"), saveGeometry());
  settings.setValue(QStringLiteral("window/state"), saveState());
  settings.setValue(QStringLiteral("window/tab"), tabs_->currentIndex());
  run_panel_->saveSettings(settings);
  event->accept();
}

void MainWindow::showAbout() {
  QMessageBox::about(this, tr("About BatchLens"), environmentHtml(system_));
}

}  // namespace batchlens::ui
