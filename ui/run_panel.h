// SPDX-License-Identifier: Apache-2.0
// The run panel: what to run (model, device, prompt, batch sizes, sampling, kernel policy or
// emulation profile), the "Apply row-wise workaround" toggle with its editable op list, and a
// footer that stays in view: the expected duration, Run / Cancel, progress and ETA.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <QWidget>

#include "core/base/error.h"
#include "core/base/progress.h"
#include "core/base/system_info.h"
#include "core/experiment/experiment.h"
#include "core/experiment/plan.h"
#include "ui/remote_targets.h"

class QCheckBox;
class QComboBox;
class QLabel;
class QLineEdit;
class QPlainTextEdit;
class QScrollArea;
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
  /// Fills the form from a spec; the workaround toggle is left as it is. A device this machine
  /// does not have stays selected, flagged "not available here" (Run then refuses with a
  /// message), never silently replaced by the CPU. The spec's prompt ids, when it has any, are
  /// what spec() runs until the prompt, the chat template or the model is edited.
  void setSpec(const experiment::ExperimentSpec& spec);
  /// Fills the form from an experiment as it ran (Run > Use this experiment's settings): its
  /// spec, and the steps and new tokens of its generation config where the spec left them to
  /// the model's defaults; a device that is not here is named with the device it ran on. The
  /// experiment's prompt ids (as it ran) are what spec() runs, never its decoded prompt text
  /// tokenised again (which need not give the same ids), until the prompt, the chat template
  /// or the model is edited.
  void setExperiment(const experiment::ExperimentResult& result);
  /// The prompt ids spec() uses instead of the prompt's text; empty when it tokenises the text.
  std::vector<std::int64_t> keptPromptIds() const;
  /// The device the form names ("cpu", "cuda:0"), and whether it can run there: on this
  /// machine, or on the SSH target the device belongs to.
  QString device() const;
  bool deviceAvailable() const;

  /// The SSH targets the device list offers devices of (issue #36): each probed target's
  /// devices as "gpu-server: cuda:0 (NVIDIA H200)", a target whose probe failed as one item
  /// flagged unreachable. The current device is kept when it is still listed.
  void setRemoteTargets(std::vector<RemoteTarget> targets);
  const std::vector<RemoteTarget>& remoteTargets() const { return targets_; }
  /// The SSH target of the chosen device, or none for a device of this machine.
  std::optional<remote::SshTarget> remoteTarget() const;
  /// Chooses `device` ("cuda:0") of targets_[target]; false when it does not list it.
  bool selectRemoteDevice(int target, const QString& device);

  /// The expected duration of the form's spec in seconds, or a negative value when unknown:
  /// decoder steps (experiment::count_steps) × the cost of one step, measured by an earlier run
  /// of this model, device and precision here (recordMeasuredCost), else a calibrated constant.
  double expectedSeconds() const;
  /// The "Expected: about N s" line shown above Run.
  QString expectedText() const;
  /// How often the estimates read the model's files (config.json, generation_config.json):
  /// once per version of them (path, size and modification time), never per keystroke.
  int modelFileReads() const { return model_file_reads_; }
  /// Remembers what one decoder step of `result`'s runs cost here (its timings over the steps
  /// its runs took), for the estimates of later runs (QSettings). A result read from a file has
  /// no timings and is ignored.
  static void recordMeasuredCost(const experiment::ExperimentResult& result);

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
  /// How the checked families are fixed: row-wise or batch-invariant (the op list's strategy,
  /// also the culprit finder's).
  ops::Strategy workaroundStrategy() const;
  /// Marks a family row-wise over [first, last] (last -1 = through the last layer).
  void setWorkaroundFamily(const QString& family, bool on, int first = 0, int last = -1);

  /// Run state: Run enabled when idle, Cancel when running.
  void setRunning(bool running);
  void showProgress(const base::Progress& progress);
  void showMessage(const QString& text);
  /// The message shown under the progress bar (showMessage's text, or the progress stage).
  QString message() const;

  void saveSettings(QSettings& settings) const;
  void restoreSettings(const QSettings& settings);

  QPushButton* runButton() const { return run_; }
  QPushButton* cancelButton() const { return cancel_; }
  QCheckBox* workaroundCheck() const { return workaround_; }
  QComboBox* workaroundStrategyBox() const { return strategy_; }
  QProgressBar* progressBar() const { return progress_; }
  QComboBox* presetCombo() const { return preset_; }
  QComboBox* policyCombo() const { return policy_; }
  QComboBox* deviceCombo() const { return device_; }
  QPushButton* targetsButton() const { return targets_button_; }
  QLabel* expectedLabel() const { return expected_; }
  QLabel* profileLabel() const { return profile_note_; }
  QTableWidget* workaroundOps() const { return ops_; }

 Q_SIGNALS:
  void runRequested(const batchlens::experiment::ExperimentSpec& spec);
  void cancelRequested();
  /// The user switched the workaround toggle.
  void workaroundToggled(bool on);
  /// The user asked to edit the SSH targets (the "SSH targets…" button).
  void targetsRequested();

 private:
  void requestRun();
  void updateModelFields();
  void updateProfileNote();
  void updateEstimate();
  /// The decoder steps of `spec` (experiment::count_steps), its model's facts read through
  /// step_facts_.
  base::Result<experiment::StepCount> stepsOf(const experiment::ExperimentSpec& spec) const;
  // The constructor's parts, in the order the fields are created (their tab order).
  void createModelFields(const base::SystemInfo& system, const experiment::ExperimentSpec& demo);
  void createSamplingFields(const experiment::ExperimentSpec& demo);
  void createWorkaroundFields();
  void createFooter();
  void connectFields();
  QWidget* buildForm();
  void buildOpList();

  QComboBox* preset_ = nullptr;
  QLineEdit* checkpoint_ = nullptr;
  QPushButton* browse_ = nullptr;
  QComboBox* device_ = nullptr;
  QPushButton* targets_button_ = nullptr;
  std::vector<RemoteTarget> targets_;
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
  // Mixed batches (issue #35): a companions file, the row under test, positions.
  QLineEdit* companions_ = nullptr;
  QPushButton* companions_browse_ = nullptr;
  QLabel* companions_note_ = nullptr;
  QSpinBox* row_ = nullptr;
  QComboBox* positions_ = nullptr;
  /// The companions read from companions_'s file, or given with a spec (then the field names
  /// where they came from); empty: identical rows.
  std::vector<setup::Prompt> companions_prompts_;
  /// Reads companions_'s file into companions_prompts_ (or clears them), says so in
  /// companions_note_, and ties the prefill to it (a mixed batch is prefilled at once).
  void loadCompanions();
  void updateCompanionFields();
  QComboBox* mode_ = nullptr;
  QComboBox* policy_ = nullptr;
  QCheckBox* workaround_ = nullptr;
  QComboBox* strategy_ = nullptr;
  QTableWidget* ops_ = nullptr;
  QPushButton* preset_ops_ = nullptr;
  QPushButton* run_ = nullptr;
  QPushButton* cancel_ = nullptr;
  QProgressBar* progress_ = nullptr;
  QLabel* status_ = nullptr;
  QLabel* profile_note_ = nullptr;
  QLabel* device_note_ = nullptr;
  QLabel* expected_ = nullptr;
  QScrollArea* scroll_ = nullptr;
  /// The device an experiment ran on, when it is not on this machine ("NVIDIA H200").
  QString missing_device_name_;
  /// Prompt ids given with a spec or an experiment, and the form they belong to: spec() uses
  /// them while the prompt text, the chat template and the model are still these.
  struct KeptPrompt {
    std::vector<std::int64_t> ids;
    QString text;
    bool chat_template = false;
    QString model;
  };
  /// The model fields as one string (preset or checkpoint directory).
  QString modelKey() const;
  void keepPromptIds(std::vector<std::int64_t> ids);
  void updatePromptNote();
  KeptPrompt kept_prompt_;
  QLabel* prompt_note_ = nullptr;
  /// The last model's step facts and the version of its files they were read from.
  mutable QString step_facts_key_;
  mutable std::optional<base::Result<experiment::ModelStepFacts>> step_facts_;
  mutable int model_file_reads_ = 0;
};

/// The run panel's defaults on the CPU: the `demo` preset, the H200 emulation profile, B=1
/// reference + 1 repeat, B=2 and B=4, one canvas of 32 new tokens (docs/benchmarks.md: the
/// one-click demo).
experiment::ExperimentSpec defaultDemoSpec();

/// "1:05" / "2:03:00" for an ETA in seconds; "?" when negative.
QString formatDuration(double seconds);

}  // namespace batchlens::ui
