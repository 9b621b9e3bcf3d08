// SPDX-License-Identifier: Apache-2.0
// Long work off the GUI thread: RunController runs experiments, FileController reads and writes
// experiment files. Both live on the GUI thread; each job runs on its own QThread and reports
// back through queued calls, so the window never freezes and no widget is touched elsewhere.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <QObject>
#include <QPointer>
#include <QString>

#include "core/analysis/repro.h"
#include "core/analysis/sweep_spec.h"
#include "core/base/cancel.h"
#include "core/base/progress.h"
#include "core/base/switches.h"
#include "core/experiment/experiment.h"
#include "core/experiment/runner.h"
#include "core/ops/policy.h"
#include "core/remote/ssh_run.h"
#include "ui/explorer_state.h"
#include "ui/sweep_view.h"

class QThread;

namespace batchlens::ui {

/// The tokenizer that decodes an experiment's ids, or null when there is none here (a
/// checkpoint directory that is not on this machine). Blocking: call off the GUI thread.
std::shared_ptr<const text::Tokenizer> tokenizerFor(const experiment::ExperimentSpec& spec);

/// Owns the background threads of one controller: starts them and, on destruction, cancels
/// and joins the ones still running.
class ThreadSet {
 public:
  ThreadSet() = default;
  ThreadSet(const ThreadSet&) = delete;
  ThreadSet& operator=(const ThreadSet&) = delete;
  ThreadSet(ThreadSet&&) = delete;
  ThreadSet& operator=(ThreadSet&&) = delete;
  ~ThreadSet();
  /// Starts `thread` and forgets it once it has finished.
  void start(QThread* thread);
  /// Waits for every thread still running.
  void joinAll();

 private:
  std::vector<QPointer<QThread>> threads_;
};

/// Runs one experiment at a time. GUI thread only; the experiment runs on a worker thread.
class RunController : public QObject {
  Q_OBJECT
  Q_DISABLE_COPY_MOVE(RunController)

 public:
  explicit RunController(QObject* parent = nullptr);
  ~RunController() override;

  bool isRunning() const { return running_; }
  /// Starts `spec` unless a run is in progress (then returns false and does nothing). The
  /// spec is validated first; an invalid one fails at once through `failed`.
  bool start(const experiment::ExperimentSpec& spec);
  /// Runs the culprit finder on `spec` with `strategy` (analysis::run_culprit_experiment):
  /// the document shows the spec with the minimal fix as its workaround and the finder's report.
  /// False (nothing started) while a run is in progress; an invalid spec fails through `failed`.
  bool startCulprit(const experiment::ExperimentSpec& spec, ops::Strategy strategy);
  /// Runs only the workaround group of the shown experiment `shown` with its own settings
  /// (experiment::run_workaround_group) and hands back `shown` with it merged: its old workaround
  /// runs replaced, the document's path and tokenizer kept, marked modified. False (nothing
  /// started) while a run is in progress or without a result.
  bool startWorkaround(const ExperimentDocument& shown, const ops::OpPolicy& workaround);
  /// Exports a minimal repro of `shown` (analysis::export_repro: the model loaded again, its
  /// B=1 reference run to the step, the folder written); `reproExported` or `reproFailed`
  /// follows, or `cancelled`; progress through progressChanged. False (nothing started) while
  /// a run is in progress or without a result.
  bool startRepro(std::shared_ptr<const experiment::ExperimentResult> shown,
                  const analysis::ReproRequest& request);
  /// Runs `spec` on an SSH target (remote::run_remote: `batchlens-cli run` there, the spec as
  /// JSON on its stdin, its progress into progressChanged, Cancel ending the remote process
  /// group); the file comes back with its SHA-256 checked into remoteRunsDir() and is the
  /// finished document (its path set: already saved). A failure says what happened there; the
  /// target keeps its copy of a finished file. False (nothing started) while a run is in
  /// progress; an invalid spec fails through `failed`.
  /// `command` "culprit" (with `extra`, e.g. "--strategy", "batch_invariant") runs the culprit
  /// finder there instead.
  bool startRemote(const remote::SshTarget& target, const experiment::ExperimentSpec& spec,
                   const std::string& command = "run", const std::vector<std::string>& extra = {});
  /// Exports the minimal repro of the experiment file `file` on an SSH target (remote::
  /// run_remote_repro: the file goes there, the repro runs where its GPU is, the folder comes
  /// back to `dir`); `reproExported`, `reproFailed` or `cancelled` follows. False (nothing
  /// started) while a run is in progress.
  bool startRemoteRepro(const remote::SshTarget& target, const QString& file,
                        const std::vector<std::string>& args, const QString& dir);
  /// Runs `sweep` (Run > Run sweep…): here, in the sweep's own folder under sweepsDir() (named by
  /// its id, so the same sweep again skips the items finished before), or with `target` on that
  /// SSH target (remote::sweep_job: its folder there, the file back checked into
  /// remoteRunsDir()), with `slurm` submitted there as a job array and followed. Progress and
  /// Cancel as for runs (Cancel of a Slurm sweep cancels its jobs); `sweepFinished` with the
  /// sweep file, or `failed` / `cancelled`. False (nothing started) while a run is in progress.
  bool startSweep(const analysis::SweepSpec& sweep, const std::optional<remote::SshTarget>& target,
                  const std::optional<remote::SlurmSubmit>& slurm = std::nullopt);
  /// Where sweeps run here keep their folders: default the application's data folder +
  /// "/sweeps".
  QString sweepsDir() const;
  void setSweepsDir(const QString& dir) { sweeps_dir_ = dir; }
  /// Where files of remote runs land: default the application's data folder + "/remote-runs".
  QString remoteRunsDir() const;
  void setRemoteRunsDir(const QString& dir) { remote_dir_ = dir; }
  /// The SSH target of the current or last run ("gpu-server"), empty when it ran here.
  const QString& remoteName() const { return remote_name_; }
  /// What the last cancel did beyond stopping the run ("scancel ended job array 12 ..." for a
  /// sweep on Slurm); empty for most runs.
  const QString& cancelNote() const { return cancel_note_; }
  /// Asks the running experiment to stop at its next step; `cancelled` follows. No-op when idle.
  void cancel();
  /// True when the current or last run is a sweep (startSweep).
  bool sweepRun() const { return sweep_run_; }
  /// True when the current or last run is a workaround group (startWorkaround).
  bool workaroundRun() const { return workaround_run_; }
  /// The spec of the current or last run (for startWorkaround: the shown spec with the
  /// workaround).
  const experiment::ExperimentSpec& lastSpec() const { return spec_; }
  /// Fused kernels and CUDA graphs for every run (the GUI's main reads them from the
  /// environment once: base::Switches::from_environment()).
  void setSwitches(const base::Switches& switches) { switches_ = switches; }

 Q_SIGNALS:
  void started();
  /// At most about 20 times a second.
  void progressChanged(const batchlens::base::Progress& progress);
  void finished(const batchlens::ui::ExperimentDocument& document);
  void failed(const QString& message);
  void cancelled();
  /// A repro folder was written: what it holds (analysis::repro_text) and where.
  void reproExported(const QString& summary, const QString& dir);
  void reproFailed(const QString& message);
  /// A sweep (startSweep) finished: its sweep file here and what ran ("sweep 1a2b…: 4 item(s)
  /// run, 0 finished before").
  void sweepFinished(const QString& path, const QString& summary);

 private:
  /// Validates `spec` and launches work(spec) as a new experiment (start, startCulprit).
  bool startNew(const experiment::ExperimentSpec& spec,
                const std::function<base::Result<experiment::ExperimentResult>(
                    const experiment::ExperimentSpec&, const experiment::RunControl&)>& work);
  /// Runs `work` on a worker thread with progress and cancellation; `finish` turns its result
  /// into the document handed over by `finished`.
  void launch(
      std::function<base::Result<experiment::ExperimentResult>(const experiment::RunControl&)> work,
      std::function<ExperimentDocument(experiment::ExperimentResult)> finish);

  /// Starts work(control) on a worker thread (a fresh cancel token, progress through
  /// progressChanged) and hands its result to done(result) on the GUI thread, isRunning() false
  /// again by then.
  template <class Work, class Done>
  void launchWork(Work work, Done done);

  experiment::ExperimentSpec spec_;
  bool workaround_run_ = false;
  QString remote_name_;
  QString remote_dir_;
  QString sweeps_dir_;
  QString cancel_note_;
  bool sweep_run_ = false;
  base::Switches switches_;
  std::shared_ptr<base::CancelToken> cancel_;
  bool running_ = false;
  ThreadSet threads_;
};

/// Opens and saves experiment files on worker threads. GUI thread only.
class FileController : public QObject {
  Q_OBJECT
  Q_DISABLE_COPY_MOVE(FileController)

 public:
  explicit FileController(QObject* parent = nullptr);
  ~FileController() override;

  /// Reads `path` (and the experiment's tokenizer) in the background; `opened` (an experiment
  /// file), `sweepOpened` (a sweep file) or `openFailed` follows. `origin` labels the document
  /// (default: the file name).
  void open(const QString& path, const QString& origin = {});
  /// Reads a sample bundled in the binary (":/samples/...", default the `mid` free one), copied
  /// to a temporary file first.
  void openEmbeddedSample(const QString& resource = embeddedSamplePath());
  /// Writes `document` to `path` in the background (temporary file + rename); `saved` or
  /// `saveFailed` follows.
  void save(const QString& path, std::shared_ptr<const experiment::ExperimentResult> result);
  /// Jobs still running.
  int busy() const { return busy_; }
  /// The resource path of the default embedded sample.
  static QString embeddedSamplePath();
  /// The resource path of the embedded sweep sample.
  static QString embeddedSweepSamplePath();
  /// Every embedded sample: (resource path, menu label), the default first.
  static QList<QPair<QString, QString>> embeddedSamples();

 Q_SIGNALS:
  void opened(const batchlens::ui::ExperimentDocument& document);
  /// The file was a sweep file (batchlens-cli sweep / sweep-merge).
  void sweepOpened(const batchlens::ui::SweepDocument& document);
  void openFailed(const QString& path, const QString& message);
  void saved(const QString& path);
  void saveFailed(const QString& path, const QString& message);

 private:
  int busy_ = 0;
  ThreadSet threads_;
};

}  // namespace batchlens::ui
