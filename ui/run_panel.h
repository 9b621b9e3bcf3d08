// SPDX-License-Identifier: Apache-2.0
// The run panel: what to run (model, device, prompt, batch sizes, sampling, kernel policy),
// the "Apply row-wise workaround" toggle with its editable op list, Run / Cancel and progress.
#pragma once

#include <QWidget>

#include "core/base/error.h"
#include "core/base/progress.h"
#include "core/base/system_info.h"
#include "core/experiment/experiment.h"

class QCheckBox;
class QComboBox;
class QLabel;
class QLineEdit;
class QPlainTextEdit;
class QProgressBar;
class QPushButton;
class QSettings;
class QSpinBox;
class QTableWidget;

namespace batchlens::ui {

/// GUI thread only. Emits runRequested with a spec; the window decides whether to start it.
class RunPanel : public QWidget {
  Q_OBJECT

 public:
  RunPanel(const base::SystemInfo& system, QWidget* parent = nullptr);

  /// The spec the form describes. InvalidArgument naming the field for a malformed entry.
  base::Result<experiment::ExperimentSpec> spec() const;
  /// Fills the form from a spec (e.g. an opened experiment's); a device not present here falls
  /// back to the CPU, and the workaround toggle is left as it is.
  void setSpec(const experiment::ExperimentSpec& spec);

  /// The op list as a policy: ops::OpPolicy::issue_workaround() when it shows the preset, else
  /// "custom_row_wise" with one row-wise rule per checked family (no rules when none is).
  ops::OpPolicy workaroundPolicy() const;
  bool workaroundEnabled() const;
  /// Sets the toggle without emitting workaroundToggled.
  void setWorkaroundEnabled(bool on);
  /// Resets the op list to the preset (ops::OpPolicy::issue_workaround()).
  void resetWorkaroundToPreset();
  /// Shows a policy's row-wise rules in the op list (families and layer ranges).
  void showWorkaroundPolicy(const ops::OpPolicy& policy);
  /// Marks a family row-wise over [first, last] (last -1 = through the last layer).
  void setWorkaroundFamily(const QString& family, bool on, int first = 0, int last = -1);

  /// Run state: Run enabled when idle, Cancel when running.
  void setRunning(bool running);
  void showProgress(const base::Progress& progress);
  void showMessage(const QString& text);

  void saveSettings(QSettings& settings) const;
  void restoreSettings(const QSettings& settings);

  QPushButton* runButton() const { return run_; }
  QPushButton* cancelButton() const { return cancel_; }
  QCheckBox* workaroundCheck() const { return workaround_; }
  QProgressBar* progressBar() const { return progress_; }
  QComboBox* presetCombo() const { return preset_; }

 Q_SIGNALS:
  void runRequested(const batchlens::experiment::ExperimentSpec& spec);
  void cancelRequested();
  /// The user switched the workaround toggle.
  void workaroundToggled(bool on);

 private:
  void requestRun();
  void updateModelFields();

  QComboBox* preset_ = nullptr;
  QLineEdit* checkpoint_ = nullptr;
  QPushButton* browse_ = nullptr;
  QComboBox* device_ = nullptr;
  QComboBox* dtype_ = nullptr;
  QComboBox* experts_ = nullptr;
  QPlainTextEdit* prompt_ = nullptr;
  QCheckBox* chat_ = nullptr;
  QLineEdit* batch_sizes_ = nullptr;
  QSpinBox* repeats_ = nullptr;
  QSpinBox* steps_ = nullptr;
  QSpinBox* max_new_tokens_ = nullptr;
  QSpinBox* seed_ = nullptr;
  QComboBox* rng_ = nullptr;
  QComboBox* prefill_ = nullptr;
  QComboBox* mode_ = nullptr;
  QComboBox* policy_ = nullptr;
  QCheckBox* workaround_ = nullptr;
  QTableWidget* ops_ = nullptr;
  QPushButton* preset_ops_ = nullptr;
  QPushButton* run_ = nullptr;
  QPushButton* cancel_ = nullptr;
  QProgressBar* progress_ = nullptr;
  QLabel* status_ = nullptr;
};

/// "1:05" / "2:03:00" for an ETA in seconds; "?" when negative.
QString formatDuration(double seconds);

}  // namespace batchlens::ui
