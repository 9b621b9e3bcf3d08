// SPDX-License-Identifier: Apache-2.0
// The explorer's main window: the Run panel dock, the comparison picker, the views' tabs, the
// menus (File, Run, View) and the status bar, wired to the controllers.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <QElapsedTimer>
#include <QMainWindow>
#include <QStringList>

#include "core/analysis/sweep_spec.h"
#include "core/base/error.h"
#include "core/base/system_info.h"
#include "core/ops/policy.h"
#include "core/remote/ssh_run.h"
#include "ui/explorer_state.h"

class QComboBox;
class QLabel;
class QMenu;
class QMessageBox;
class QProgressBar;
class QTabWidget;

namespace batchlens::ui {

class RunPanel;
class RunController;
class FileController;
class OverviewView;
class LayerStepView;
class SpreadView;
class TextDiffView;
class RoutingView;
class KernelsView;
class SweepDialog;
class SweepView;

/// The BatchLens main window. Lives on the GUI thread and only composes: the run panel (dock),
/// the comparison picker, the explorer tabs, the menus and the status bar. Long work goes to
/// RunController and FileController; errors are shown in a non-modal dialog and never end the
/// program.
class MainWindow : public QMainWindow {
  Q_OBJECT
  Q_DISABLE_COPY_MOVE(MainWindow)

 public:
  /// `system` is shown in the status bar and Help > About, and fills the device list.
  explicit MainWindow(base::SystemInfo system, QWidget* parent = nullptr);
  ~MainWindow() override;

  /// The one-line environment summary shown in the status bar, e.g.
  /// "LibTorch 1.13.0 · CPU 2 threads · CUDA: not in this build".
  QString environmentSummary() const;

  /// Opens an experiment file in the background; the views follow when it is read.
  void openFile(const QString& path);
  /// Opens the sample experiment bundled in the binary.
  /// Opens a sample bundled in the binary (FileController::embeddedSamples), default `mid`.
  void openEmbeddedSample(const QString& resource = QString());
  /// Saves the shown experiment to `path` in the background. When that fails, the experiment
  /// stays open (and unsaved, for a run) and a dialog gives the reason and offers Save As.
  void saveTo(const QString& path);
  /// True while a save of the shown experiment is in flight.
  bool savingShown() const;
  /// Writes the report of the current comparison into `dir` (GUI thread, synchronous).
  base::Result<QStringList> exportReportTo(const QString& dir);
  /// The shown sweep's report into `dir` (exportSweepReport).
  base::Result<QStringList> exportSweepReportTo(const QString& dir);
  /// File > Export minimal repro into `dir` (made; a previous repro there is replaced): the
  /// first divergence of the selected comparison (or of the first that diverges), in the
  /// background with progress and Cancel in the run panel (analysis::export_repro). False,
  /// with the reason shown, when it cannot start.
  bool exportReproTo(const QString& dir);
  /// Starts a run of the run panel's spec (a message in the panel if it is not valid).
  void runFromPanel();
  /// Run > Find culprit: the finder on the run panel's spec with the op list's strategy.
  void findCulprit();
  /// Run > Run sweep…: the sweep dialog (non-modal, "SweepDialog") for the Run panel's spec
  /// where its device is; Run sweep there starts it (runSweep). Null, with the reason in the
  /// panel, when the panel's spec is not valid or a run is in progress.
  SweepDialog* chooseSweep();
  /// Runs `sweep` where the Run panel's device is (here or its SSH target; with `slurm`,
  /// submitted there); the sweep file opens in the Sweep tab when it is done.
  void runSweep(const analysis::SweepSpec& sweep,
                const std::optional<remote::SlurmSubmit>& slurm = std::nullopt);

  ExplorerState* state() const { return state_; }
  RunPanel* runPanel() const { return run_panel_; }
  RunController* runController() const { return runs_; }
  FileController* fileController() const { return files_; }
  QTabWidget* tabs() const { return tabs_; }
  /// The status bar's busy bar, visible while a file or sample loads.
  QProgressBar* loadingIndicator() const { return loading_bar_; }
  /// Wall time of the last finished run, from Run to the result (-1 before one).
  double lastRunSeconds() const { return last_run_seconds_; }
  QComboBox* comparisonPicker() const { return picker_; }
  OverviewView* overview() const { return overview_; }
  LayerStepView* layerStep() const { return layer_step_; }
  SpreadView* spread() const { return spread_; }
  TextDiffView* textDiff() const { return text_diff_; }
  RoutingView* routing() const { return routing_; }
  KernelsView* kernels() const { return kernels_; }
  SweepView* sweep() const { return sweep_; }
  /// A sweep item asked for (SweepView::itemActivated): opens its kept experiment, else offers
  /// (a non-modal dialog, "SweepItemOffer") to re-run it as a full experiment.
  void openSweepItem(int item);
  /// Runs a sweep item as a full experiment (every tap, kernel provenance) in the background.
  void rerunSweepItem(int item);
  /// The text of the last error shown (tests, logs).
  QString lastError() const { return last_error_; }
  static QStringList recentFiles();

 Q_SIGNALS:
  /// A document (file, sample or run) is now shown.
  void documentShown();
  /// An error dialog was shown with this text.
  void errorShown(const QString& message);
  /// Switching the workaround on could not run here; a dialog offers the CPU demo or this
  /// command for the GPU server.
  void workaroundElsewhereOffered(const QString& command);
  /// A minimal repro folder was written (exportReproTo).
  void reproExported(const QString& dir);
  /// A sweep file is now shown in the Sweep tab.
  void sweepShown();

 protected:
  void dragEnterEvent(QDragEnterEvent* event) override;
  void dropEvent(QDropEvent* event) override;
  void closeEvent(QCloseEvent* event) override;

 private:
  void buildMenus();
  void buildCentre();
  void connectControllers();
  void showDocument(const ExperimentDocument& document);
  void showError(const QString& title, const QString& message);
  void addRecentFile(const QString& path);
  void rebuildRecentMenu();
  void refreshPicker();
  void updateTitle();
  void onWorkaroundToggled(bool on);
  /// Starts a run for the workaround toggle (`start` starts it, or not): the toggle is put back
  /// when that run is cancelled or fails, and at once when it did not start.
  void startForToggle(const std::function<void()>& start);
  /// Puts the workaround toggle back as it was before a run it started (Cancel, failure).
  void restoreWorkaroundToggle();
  /// The shown experiment cannot run here (`reason`): a non-modal dialog offers the CPU demo
  /// with the emulation profile standing for its GPU (for a CPU experiment: running it again
  /// here, whole), or the CLI command for the machine it was recorded on.
  QMessageBox* offerWorkaroundElsewhere(const experiment::ExperimentResult& shown,
                                        const QString& reason, const ops::OpPolicy& workaround);
  /// A run the dialog of offerWorkaroundElsewhere offers: `fill_panel` sets the run panel, then
  /// the run starts with the workaround on; refused while a run is in progress.
  void startFromOffer(const std::function<void()>& fill_panel);
  /// The shown document's file name without extension, "experiment" for an unsaved run.
  QString documentStem() const;
  /// Runs `spec` here.
  void startRun(const experiment::ExperimentSpec& spec);
  /// Runs the Run panel's `spec` where its device is: here, or on its SSH target.
  void startPanelRun(const experiment::ExperimentSpec& spec);
  /// The "SSH targets…" dialog; on OK the Run panel lists their devices and QSettings keeps
  /// them.
  void editRemoteTargets();
  void chooseOpen();
  /// Asks where to save (the dialog starts in saveDialogDir) and starts the save; false when
  /// the user cancelled.
  bool chooseSaveAs();
  QMessageBox* showSaveError(const QString& path, const QString& message, bool unsaved);
  std::shared_ptr<const experiment::ExperimentResult> takeSave(const QString& path);
  void chooseExport();
  void chooseExportRepro();
  // An export's target folder from a save dialog (new folders welcome), starting in the last
  // export folder with proposed(that folder) as the name; empty when cancelled or not a folder.
  QString chooseExportFolder(const QString& title,
                             const std::function<QString(const QString&)>& proposed);
  void showAbout();

  base::SystemInfo system_;
  ExplorerState* state_ = nullptr;
  RunPanel* run_panel_ = nullptr;
  RunController* runs_ = nullptr;
  FileController* files_ = nullptr;
  QComboBox* picker_ = nullptr;
  QTabWidget* tabs_ = nullptr;
  OverviewView* overview_ = nullptr;
  LayerStepView* layer_step_ = nullptr;
  SpreadView* spread_ = nullptr;
  TextDiffView* text_diff_ = nullptr;
  RoutingView* routing_ = nullptr;
  KernelsView* kernels_ = nullptr;
  SweepView* sweep_ = nullptr;
  QMenu* recent_menu_ = nullptr;
  QLabel* environment_label_ = nullptr;
  QLabel* document_label_ = nullptr;
  QDockWidget* run_dock_ = nullptr;
  int dock_width_ = 440;                 ///< the Run dock's width as the user left it
  int last_window_width_ = 0;            ///< to tell a dock drag from a window resize
  QElapsedTimer run_clock_;              ///< since the running experiment started
  double last_run_seconds_ = -1;         ///< wall time of the last finished run
  QProgressBar* loading_bar_ = nullptr;  ///< busy while a file or sample loads
  int loading_ = 0;                      ///< files being opened
  int busy_cursors_ = 0;                 ///< override cursors set by setLoading
  /// Counts a file open starting (+1) or ending (-1); shows the busy bar while any is open.
  void setLoading(int change);
  QString last_error_;
  /// Saves in flight: the path and the experiment being written to it.
  std::vector<std::pair<QString, std::shared_ptr<const experiment::ExperimentResult>>> saves_;
  /// The window closes once the shown experiment is saved (the user chose Save on close).
  bool close_after_save_ = false;
  /// The user chose "Stop the run and close" while a run was in progress.
  bool close_during_run_confirmed_ = false;
  /// The workaround toggle's state before the run it started; restored on Cancel or failure.
  std::optional<bool> restore_workaround_;
};

/// Where the Save As dialog starts: the folder of `document_path` (the opened file), else
/// `last_dir` (the folder last used), else the documents or home folder; never the root folder
/// or one that does not exist.
QString saveDialogDir(const QString& last_dir, const QString& document_path);

/// The About box's HTML for a system: the build, LibTorch and the devices.
QString environmentHtml(const base::SystemInfo& system);

}  // namespace batchlens::ui
