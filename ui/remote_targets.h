// SPDX-License-Identifier: Apache-2.0
// The GPU servers the user added as SSH targets (issue #36): kept in QSettings with what their
// last probe found (BatchLens there, LibTorch, host name, devices), probed off the GUI thread
// (`batchlens-cli info --json` over `ssh -o BatchMode=yes`), and edited in the Run panel's
// "SSH targets…" dialog. The Run panel lists each target's devices as "gpu-server: cuda:0
// (NVIDIA H200)"; runs on them go through remote::run_remote.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include <QDialog>
#include <QString>

#include "core/remote/ssh_run.h"

class QLabel;
class QLineEdit;
class QPushButton;
class QSettings;
class QTableWidget;

namespace batchlens::ui {

class ThreadSet;

/// One SSH target and what its last probe said.
struct RemoteTarget {
  remote::SshTarget ssh;
  /// The last probe's answer, when it succeeded.
  std::optional<remote::TargetInfo> info;
  /// Why the last probe failed ("" when it did not, or none ran).
  QString error;

  /// "gpu-server" or "user@host:2222" (remote::SshTarget::describe).
  QString name() const;
  /// "BatchLens 0.1.0, LibTorch 2.11.0, host gpu01: cuda:0 (NVIDIA H200), cpu", the error, or
  /// "not probed yet".
  QString status() const;
};

/// The targets kept in `settings` (group "remote"); malformed entries are skipped.
std::vector<RemoteTarget> loadRemoteTargets(QSettings& settings);
void saveRemoteTargets(QSettings& settings, const std::vector<RemoteTarget>& targets);

/// Probes `target` (blocking: call off the GUI thread) and returns it with info or error set.
RemoteTarget probeTarget(RemoteTarget target);

/// The target that recorded an experiment on `host` (its provenance host), with a device named
/// `device_name` ("NVIDIA H200"; "" matches any): the index into `targets`, or -1.
int targetRecordedOn(const std::vector<RemoteTarget>& targets, const std::string& host,
                     const std::string& device_name);

/// Adds, removes and probes SSH targets. Probing runs on a worker thread; the dialog stays
/// responsive and can be closed meanwhile (the answer is then dropped).
class RemoteTargetsDialog : public QDialog {
  Q_OBJECT
  Q_DISABLE_COPY_MOVE(RemoteTargetsDialog)

 public:
  RemoteTargetsDialog(std::vector<RemoteTarget> targets, QWidget* parent = nullptr);
  ~RemoteTargetsDialog() override;

  const std::vector<RemoteTarget>& targets() const { return targets_; }
  /// Adds the target the fields describe (and probes it). False, with the reason shown, for a
  /// malformed target (remote::parse_target) or one already listed.
  bool addFromFields();
  /// Probes every target; `probed` follows when all have answered.
  void probeAll();
  bool probing() const { return probing_ > 0; }

  QLineEdit* hostEdit() const { return host_; }
  QLineEdit* cliEdit() const { return cli_; }
  QLineEdit* workdirEdit() const { return workdir_; }
  QLineEdit* sshOptionsEdit() const { return ssh_options_; }
  QTableWidget* table() const { return table_; }
  QLabel* messageLabel() const { return message_; }

 Q_SIGNALS:
  /// Every probe started so far has answered.
  void probed();

 private:
  void refresh();
  void probe(int row);
  void removeSelected();

  std::vector<RemoteTarget> targets_;
  QLineEdit* host_ = nullptr;
  QLineEdit* cli_ = nullptr;
  QLineEdit* workdir_ = nullptr;
  QLineEdit* ssh_options_ = nullptr;
  QTableWidget* table_ = nullptr;
  QLabel* message_ = nullptr;
  QPushButton* add_ = nullptr;
  QPushButton* remove_ = nullptr;
  QPushButton* probe_ = nullptr;
  int probing_ = 0;
  /// Bumped when the list changes under a running probe (a removal): its answer is dropped.
  int generation_ = 0;
  /// The probes, joined when the dialog goes (a probe waits for ssh's own timeouts).
  std::unique_ptr<ThreadSet> threads_;
};

}  // namespace batchlens::ui
