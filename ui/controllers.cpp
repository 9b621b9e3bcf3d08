// SPDX-License-Identifier: Apache-2.0
#include "ui/controllers.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include <QCoreApplication>
#include <QDateTime>
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QRegularExpression>
#include <QStandardPaths>
#include <QThread>

#include "core/analysis/culprit.h"
#include "core/analysis/explain.h"
#include "core/experiment/runner.h"
#include "core/io/experiment_file.h"
#include "core/io/sweep_file.h"
#include "core/io/sweep_run.h"
#include "core/setup/front_door.h"
#include "ui/qt_text.h"

// Q_INIT_RESOURCE must be called at global scope: the sample lives in batchlens_ui, a static
// library, whose resources are registered only when something references them.
static void initSampleResource() {
  Q_INIT_RESOURCE(samples);
}

namespace batchlens::ui {

namespace {

// Runs `work` on a new thread of `threads`; `done(value)` then runs on `context`'s thread,
// unless `context` is gone by then. `value` travels in a shared_ptr so it is never copied.
template <class Work, class Done>
void runInBackground(ThreadSet& threads, QObject* context, Work work, Done done) {
  QThread* thread = QThread::create([context, work = std::move(work), done = std::move(done)] {
    auto value = std::make_shared<decltype(work())>(work());
    QMetaObject::invokeMethod(
        context, [done, value] { done(std::move(*value)); }, Qt::QueuedConnection);
  });
  threads.start(thread);
}

ExperimentDocument makeDocument(experiment::ExperimentResult result, QString path, QString origin) {
  ExperimentDocument doc;
  doc.tokenizer = tokenizerFor(result.spec);
  doc.result = std::make_shared<const experiment::ExperimentResult>(std::move(result));
  doc.path = std::move(path);
  doc.origin = std::move(origin);
  return doc;
}

// What a file held: an experiment or a sweep.
struct Opened {
  std::optional<ExperimentDocument> experiment;
  std::optional<SweepDocument> sweep;
};

// Reads `file` as a sweep file when it says it is one, else as an experiment file. `path`
// is what the document records (empty for an embedded sample), `label` its origin.
base::Result<Opened> readDocument(const std::string& file, const QString& path,
                                  const QString& label) {
  if (io::is_sweep_file(file)) {
    auto sweep = io::read_sweep_file(file);
    if (!sweep.ok()) {
      return sweep.error();
    }
    return Opened{
        std::nullopt,
        SweepDocument{std::make_shared<const analysis::SweepRecords>(std::move(sweep).value()),
                      path}};
  }
  auto result = io::read_experiment(file);
  if (!result.ok()) {
    return result.error();
  }
  return Opened{makeDocument(std::move(result).value(), path, label), std::nullopt};
}

// Emits what `outcome` holds from `files`.
void emitOpened(FileController* files, const base::Result<Opened>& outcome, const QString& path) {
  if (!outcome.ok()) {
    Q_EMIT files->openFailed(path, q(outcome.error().message));
  } else if (outcome.value().sweep) {
    Q_EMIT files->sweepOpened(*outcome.value().sweep);
  } else {
    Q_EMIT files->opened(*outcome.value().experiment);
  }
}

}  // namespace

namespace {

// A worker's RunControl: cancelled by `token`, progress posted to `self`'s progressChanged on
// its thread at most 20 times a second (the final report of a run always gets through).
experiment::RunControl workerControl(RunController* self, const base::CancelToken* token) {
  using Clock = std::chrono::steady_clock;
  auto last = std::make_shared<Clock::time_point>(Clock::now() - std::chrono::seconds(1));
  const auto post = [last, self](const base::Progress& p, bool final_report) {
    const auto now = Clock::now();
    if (now - *last < std::chrono::milliseconds(50) && !final_report) {
      return;
    }
    *last = now;
    QMetaObject::invokeMethod(
        self, [self, p] { Q_EMIT self->progressChanged(p); }, Qt::QueuedConnection);
  };
  experiment::RunControl control;
  control.cancel = token;
  control.progress = [post](const base::Progress& p) {
    post(p, p.done >= p.total);
  };
  // Loading has no step count: total 0 shows a busy bar with the tensor being loaded.
  control.load_progress = [post](const base::Progress& p) {
    base::Progress loading;
    loading.stage = "loading weights: " + p.stage;
    loading.elapsed_s = p.elapsed_s;
    post(loading, false);
  };
  return control;
}

}  // namespace

std::shared_ptr<const text::Tokenizer> tokenizerFor(const experiment::ExperimentSpec& spec) {
  auto tokenizer = setup::tokenizer_for(spec.model);
  return tokenizer.ok() ? tokenizer.value() : nullptr;
}

ThreadSet::~ThreadSet() {
  joinAll();
}

void ThreadSet::start(QThread* thread) {
  // Drop the threads that have finished and been deleted.
  threads_.erase(std::remove_if(threads_.begin(), threads_.end(),
                                [](const QPointer<QThread>& t) { return t.isNull(); }),
                 threads_.end());
  QObject::connect(thread, &QThread::finished, thread, &QObject::deleteLater);
  threads_.emplace_back(thread);
  thread->start();
}

void ThreadSet::joinAll() {
  for (auto& t : threads_) {
    if (!t.isNull()) {
      t->wait();
      delete t.data();
    }
  }
  threads_.clear();
}

RunController::RunController(QObject* parent) : QObject(parent) {}

RunController::~RunController() {
  cancel();
  threads_.joinAll();
}

bool RunController::start(const experiment::ExperimentSpec& spec) {
  return startNew(spec,
                  [](const experiment::ExperimentSpec& s, const experiment::RunControl& control) {
                    // Beside companions the re-runs that tell the causes apart, and where row 0
                    // diverges the exact reference (issue #35).
                    return analysis::run_and_explain(s, {}, control);
                  });
}

bool RunController::startRemote(const remote::SshTarget& target,
                                const experiment::ExperimentSpec& spec, const std::string& command,
                                const std::vector<std::string>& extra) {
  if (running_) {
    return false;
  }
  spec_ = spec;
  if (command == "culprit") {
    spec_.workaround.reset();  // the finder's fix becomes the workaround
  }
  workaround_run_ = false;
  remote_name_ = q(target.describe());
  if (auto valid = experiment::validate(spec_); !valid.ok()) {
    Q_EMIT failed(q(valid.error().message));
    return true;
  }
  // "<host>-<model>-<time>.h5": never an existing file (run_remote writes beside it and renames).
  QString stem =
      QStringLiteral("%1-%2-%3")
          .arg(remote_name_, q(spec_.model.preset.empty() ? "checkpoint" : spec_.model.preset),
               QDateTime::currentDateTime().toString(QStringLiteral("yyyyMMdd-HHmmss")));
  stem.replace(QRegularExpression(QStringLiteral("[^A-Za-z0-9._-]")), QStringLiteral("_"));
  const QString dir = remoteRunsDir();
  QString local = QDir(dir).filePath(stem + QStringLiteral(".h5"));
  for (int n = 2; QFileInfo::exists(local); ++n) {
    local = QDir(dir).filePath(QStringLiteral("%1-%2.h5").arg(stem).arg(n));
  }
  launch(
      [target, spec = spec_, dir, local, command,
       extra](const experiment::RunControl& control) -> base::Result<experiment::ExperimentResult> {
        if (!QDir().mkpath(dir)) {
          return base::Error{base::ErrorCode::IoFailed,
                             "cannot make " + dir.toStdString() + " for the remote run's file"};
        }
        auto outcome =
            remote::run_remote(target, command, spec, extra, local.toStdString(), control);
        if (!outcome.ok()) {
          return outcome.error();
        }
        return io::read_experiment(local.toStdString());
      },
      [local, name = remote_name_](experiment::ExperimentResult result) {
        ExperimentDocument doc = makeDocument(std::move(result), local, QString());
        doc.origin =
            tr("run on %1 at %2")
                .arg(name, QDateTime::currentDateTime().toString(QStringLiteral("HH:mm:ss")));
        return doc;  // saved already: its file came back
      });
  return true;
}

QString RunController::remoteRunsDir() const {
  if (!remote_dir_.isEmpty()) {
    return remote_dir_;
  }
  return QDir(QStandardPaths::writableLocation(QStandardPaths::AppLocalDataLocation))
      .filePath(QStringLiteral("remote-runs"));
}

QString RunController::sweepsDir() const {
  if (!sweeps_dir_.isEmpty()) {
    return sweeps_dir_;
  }
  return QDir(QStandardPaths::writableLocation(QStandardPaths::AppLocalDataLocation))
      .filePath(QStringLiteral("sweeps"));
}

bool RunController::startSweep(const analysis::SweepSpec& sweep,
                               const std::optional<remote::SshTarget>& target,
                               const std::optional<remote::SlurmSubmit>& slurm) {
  if (running_) {
    return false;
  }
  spec_ = sweep.base;
  workaround_run_ = false;
  remote_name_ = target ? q(target->describe()) : QString();
  sweep_run_ = true;
  if (auto valid = analysis::validate(sweep); !valid.ok()) {
    Q_EMIT failed(q(valid.error().message));
    return true;
  }
  const std::string id = analysis::sweep_id(sweep);
  QString stem = QStringLiteral("%1-sweep-%2").arg(remote_name_, q(id.substr(0, 12)));
  stem.replace(QRegularExpression(QStringLiteral("[^A-Za-z0-9._-]")), QStringLiteral("_"));
  const QString local = target ? QDir(remoteRunsDir()).filePath(stem + QStringLiteral(".h5"))
                               : QDir(sweepsDir()).filePath(q("sweep-" + id));
  launchWork(
      [sweep, target, slurm, local](const experiment::RunControl& control)
          -> base::Result<std::pair<std::string, std::string>> {
        const std::string where = local.toStdString();
        if (!QDir().mkpath(target ? QFileInfo(local).absolutePath() : local)) {
          return base::Error{base::ErrorCode::IoFailed, "cannot make the folder of " + where};
        }
        if (target) {
          auto outcome =
              remote::run_remote_job(*target, remote::sweep_job(sweep, slurm), where, control);
          if (!outcome.ok()) {
            return outcome.error();
          }
          return std::make_pair(where, outcome.value().summary);
        }
        analysis::SweepRunOptions run;
        run.dir = where;
        auto done = io::run_sweep_to_file(sweep, run, /*shard_file=*/false, control);
        if (!done.ok()) {
          return done.error();
        }
        const analysis::SweepOutcome& o = done.value().outcome;
        return std::make_pair(done.value().file.string(),
                              "sweep " + o.id + ": " + std::to_string(o.items_run) +
                                  " item(s) run, " + std::to_string(o.items_skipped) +
                                  " finished before and skipped");
      },
      [this](base::Result<std::pair<std::string, std::string>> outcome) {
        if (outcome.ok()) {
          Q_EMIT sweepFinished(q(outcome.value().first), q(outcome.value().second));
        } else if (outcome.error().code == base::ErrorCode::Cancelled) {
          cancel_note_ = q(outcome.error().message);
          Q_EMIT cancelled();
        } else {
          Q_EMIT failed(q(outcome.error().message));
        }
      });
  sweep_run_ = true;  // launchWork starts every run as not a sweep
  return true;
}

bool RunController::startCulprit(const experiment::ExperimentSpec& spec, ops::Strategy strategy) {
  experiment::ExperimentSpec s = spec;
  s.workaround.reset();  // the finder's fix becomes the workaround
  return startNew(
      s, [strategy](const experiment::ExperimentSpec& sp, const experiment::RunControl& control) {
        analysis::CulpritOptions options;
        options.strategy = strategy;
        return analysis::run_culprit_experiment(sp, options, control);
      });
}

bool RunController::startNew(
    const experiment::ExperimentSpec& spec,
    const std::function<base::Result<experiment::ExperimentResult>(
        const experiment::ExperimentSpec&, const experiment::RunControl&)>& work) {
  if (running_) {
    return false;
  }
  spec_ = spec;
  spec_.load.switches = switches_;
  workaround_run_ = false;
  remote_name_.clear();
  if (auto valid = experiment::validate(spec_); !valid.ok()) {
    Q_EMIT failed(q(valid.error().message));
    return true;
  }
  launch(
      [spec = spec_, work](const experiment::RunControl& control) { return work(spec, control); },
      [spec = spec_](experiment::ExperimentResult result) {
        ExperimentDocument doc;
        doc.tokenizer = tokenizerFor(spec);
        doc.result = std::make_shared<const experiment::ExperimentResult>(std::move(result));
        doc.origin =
            tr("run at %1")
                .arg(QDateTime::currentDateTime().toString(QStringLiteral("yyyy-MM-dd HH:mm:ss")));
        doc.modified = true;
        return doc;
      });
  return true;
}

bool RunController::startWorkaround(const ExperimentDocument& shown,
                                    const ops::OpPolicy& workaround) {
  if (running_ || shown.result == nullptr) {
    return false;
  }
  spec_ = shown.result->spec;
  spec_.workaround = workaround;
  workaround_run_ = true;
  remote_name_.clear();
  launch(
      [result = shown.result, workaround](const experiment::RunControl& control) {
        return experiment::run_workaround_group(*result, workaround, control);
      },
      [shown](experiment::ExperimentResult merged) {
        ExperimentDocument doc = shown;
        if (doc.tokenizer == nullptr) {
          doc.tokenizer = tokenizerFor(merged.spec);
        }
        doc.result = std::make_shared<const experiment::ExperimentResult>(std::move(merged));
        doc.origin =
            tr("%1 + workaround run at %2")
                .arg(shown.origin,
                     QDateTime::currentDateTime().toString(QStringLiteral("yyyy-MM-dd HH:mm:ss")));
        doc.modified = true;
        return doc;
      });
  return true;
}

template <class Work, class Done>
void RunController::launchWork(Work work, Done done) {
  cancel_ = std::make_shared<base::CancelToken>();
  cancel_note_.clear();
  sweep_run_ = false;
  running_ = true;
  Q_EMIT started();
  auto token = cancel_;
  // The worker never outlives `this`: the destructor cancels and joins it first.
  RunController* self = this;
  runInBackground(
      threads_, this,
      [work = std::move(work), token, self] { return work(workerControl(self, token.get())); },
      [this, done = std::move(done)](auto outcome) {
        running_ = false;
        done(std::move(outcome));
      });
}

void RunController::launch(
    std::function<base::Result<experiment::ExperimentResult>(const experiment::RunControl&)> work,
    std::function<ExperimentDocument(experiment::ExperimentResult)> finish) {
  launchWork(
      [work = std::move(work), finish = std::move(finish)](const experiment::RunControl& control) {
        auto result = work(control);
        // The document (and its tokenizer) is built here, off the GUI thread.
        std::optional<ExperimentDocument> doc;
        base::Error error;
        if (result.ok()) {
          doc = finish(std::move(result).value());
        } else {
          error = result.error();
        }
        return std::make_pair(std::move(doc), std::move(error));
      },
      [this](auto outcome) {
        auto& [doc, error] = outcome;
        if (!doc) {
          if (error.code == base::ErrorCode::Cancelled) {
            Q_EMIT cancelled();
          } else {
            Q_EMIT failed(QStringLiteral("%1: %2").arg(
                QString::fromLatin1(base::to_string(error.code)), q(error.message)));
          }
          return;
        }
        Q_EMIT finished(*doc);
      });
}

bool RunController::startRepro(std::shared_ptr<const experiment::ExperimentResult> shown,
                               const analysis::ReproRequest& request) {
  if (running_ || shown == nullptr) {
    return false;
  }
  launchWork(
      [shown = std::move(shown), request](const experiment::RunControl& control) {
        return analysis::export_repro(*shown, request, control);
      },
      [this](base::Result<analysis::ReproExport> outcome) {
        if (outcome.ok()) {
          Q_EMIT reproExported(q(analysis::repro_text(outcome.value())),
                               q(outcome.value().dir.string()));
        } else if (outcome.error().code == base::ErrorCode::Cancelled) {
          Q_EMIT cancelled();
        } else {
          Q_EMIT reproFailed(q(outcome.error().message));
        }
      });
  return true;
}

bool RunController::startRemoteRepro(const remote::SshTarget& target, const QString& file,
                                     const std::vector<std::string>& args, const QString& dir) {
  if (running_) {
    return false;
  }
  remote_name_ = q(target.describe());
  launchWork(
      [target, file = file.toStdString(), args,
       dir = dir.toStdString()](const experiment::RunControl& control) {
        return remote::run_remote_repro(target, file, args, dir, control);
      },
      [this, dir](base::Result<remote::RemoteOutcome> outcome) {
        if (outcome.ok()) {
          Q_EMIT reproExported(q(outcome.value().summary), dir);
        } else if (outcome.error().code == base::ErrorCode::Cancelled) {
          Q_EMIT cancelled();
        } else {
          Q_EMIT reproFailed(q(outcome.error().message));
        }
      });
  return true;
}

void RunController::cancel() {
  if (cancel_) {
    cancel_->cancel();
  }
}

FileController::FileController(QObject* parent) : QObject(parent) {
  initSampleResource();
}

FileController::~FileController() {
  threads_.joinAll();
}

QString FileController::embeddedSamplePath() {
  return QStringLiteral(":/samples/mid-h100-free.h5");
}

QString FileController::embeddedSweepSamplePath() {
  return QStringLiteral(":/samples/h200-26b-a4b-sweep.h5");
}

void FileController::open(const QString& path, const QString& origin) {
  ++busy_;
  const QString label = origin.isEmpty() ? QFileInfo(path).fileName() : origin;
  runInBackground(
      threads_, this,
      [path, label]() -> base::Result<Opened> {
        return readDocument(QFile::encodeName(path).toStdString(),
                            QFileInfo(path).absoluteFilePath(), label);
      },
      [this, path](const base::Result<Opened>& outcome) {
        --busy_;
        emitOpened(this, outcome, path);
      });
}

QList<QPair<QString, QString>> FileController::embeddedSamples() {
  return {{embeddedSamplePath(), QObject::tr("mid, H100, free mode (the default)")},
          {QStringLiteral(":/samples/26ba4b-h100-lockstep.h5"),
           QObject::tr("26B-A4B architecture, H100, lockstep")},
          {embeddedSweepSamplePath(),
           QObject::tr("26B-A4B architecture, H200, sweep of 24 prompts (B = 2, 3, 4)")},
          {QStringLiteral(":/samples/h100-26b-a4b-mixed-sweep.h5"),
           QObject::tr("26B-A4B architecture, H100, sweep of 24 prompts beside 3 companions "
                       "(B = 4, shared positions, default and batch-invariant kernels)")},
          {QStringLiteral(":/samples/demo-trained-cpu-emulated.h5"),
           QObject::tr("demo-trained, CPU, EMULATED H200 (the one-click demo)")}};
}

void FileController::openEmbeddedSample(const QString& resource_path) {
  ++busy_;
  runInBackground(
      threads_, this,
      [resource_path]() -> base::Result<Opened> {
        // HDF5 reads files, not memory: copy the resource to a private temporary file.
        QFile resource(resource_path);
        if (!resource.open(QIODevice::ReadOnly)) {
          return base::Error{base::ErrorCode::FileNotFound,
                             "the embedded sample is missing from this build"};
        }
        const QString temp = QDir(QStandardPaths::writableLocation(QStandardPaths::TempLocation))
                                 .filePath(QStringLiteral("batchlens-sample-%1.h5")
                                               .arg(QCoreApplication::applicationPid()));
        {
          QFile out(temp);
          if (!out.open(QIODevice::WriteOnly | QIODevice::Truncate) ||
              out.write(resource.readAll()) != resource.size()) {
            QFile::remove(temp);
            return base::Error{base::ErrorCode::IoFailed,
                               "could not copy the embedded sample to " + temp.toStdString()};
          }
        }
        auto result = readDocument(
            temp.toStdString(), QString(),
            QObject::tr("embedded sample (%1)").arg(QFileInfo(resource_path).fileName()));
        QFile::remove(temp);
        return result;
      },
      [this](const base::Result<Opened>& outcome) {
        --busy_;
        emitOpened(this, outcome, embeddedSamplePath());
      });
}

void FileController::save(const QString& path,
                          std::shared_ptr<const experiment::ExperimentResult> result) {
  ++busy_;
  runInBackground(
      threads_, this,
      [path, result = std::move(result)] {
        return io::write_experiment(QFile::encodeName(path).toStdString(), *result);
      },
      [this, path](const base::Result<void>& outcome) {
        --busy_;
        if (outcome.ok()) {
          Q_EMIT saved(path);
        } else {
          Q_EMIT saveFailed(path, q(outcome.error().message));
        }
      });
}

}  // namespace batchlens::ui
