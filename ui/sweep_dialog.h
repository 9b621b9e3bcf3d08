// SPDX-License-Identifier: Apache-2.0
// Run > Run sweep… (issues #19, #36): the Run panel's experiment over a prompts file × seeds, and
// issue #35's axes (companion sets, the row under test), run here, on the SSH target the Run
// panel's device belongs to, or submitted to Slurm on that target when it is a login node. The
// fields are checked as they are typed (analysis::sweep_from_input: the files read here): the
// dialog says how many items it runs, or why it cannot, and Run stays off until it can.
#pragma once

#include <optional>

#include <QDialog>
#include <QString>

#include "core/analysis/sweep_spec.h"
#include "core/base/error.h"
#include "core/experiment/experiment.h"
#include "core/remote/ssh_run.h"

class QGroupBox;
class QLabel;
class QLineEdit;
class QPushButton;
class QDoubleSpinBox;
class QSpinBox;
class QTimer;

namespace batchlens::ui {

class SweepDialog : public QDialog {
  Q_OBJECT
  Q_DISABLE_COPY_MOVE(SweepDialog)

 public:
  /// `base`: every item's spec (the Run panel's). `where`: the device it runs on, as the Run
  /// panel names it. `remote`: on an SSH target (then Slurm can be chosen).
  SweepDialog(experiment::ExperimentSpec base, const QString& where, bool remote,
              QWidget* parent = nullptr);
  ~SweepDialog() override;

  /// The sweep the fields describe, or why it cannot run (the field named).
  base::Result<analysis::SweepSpec> sweep() const;
  /// How it is submitted to Slurm on the target; none when it runs directly.
  std::optional<remote::SlurmSubmit> slurm() const;

  QLineEdit* promptsEdit() const { return prompts_; }
  QLineEdit* seedsEdit() const { return seeds_; }
  QLineEdit* companionsEdit() const { return companions_; }
  QLineEdit* rowsEdit() const { return rows_; }
  QGroupBox* slurmBox() const { return slurm_box_; }
  QSpinBox* shardsSpin() const { return shards_; }
  QSpinBox* gpusSpin() const { return gpus_; }
  QLineEdit* sbatchEdit() const { return sbatch_; }
  QLabel* summaryLabel() const { return summary_; }
  QPushButton* runButton() const { return run_; }

  /// Checks the fields now (otherwise 250 ms after the last edit): the summary and Run.
  void refresh();

 private:
  void browsePrompts();

  experiment::ExperimentSpec base_;
  QLineEdit* prompts_ = nullptr;
  QLineEdit* seeds_ = nullptr;
  QLineEdit* companions_ = nullptr;
  QLineEdit* rows_ = nullptr;
  QGroupBox* slurm_box_ = nullptr;
  QSpinBox* shards_ = nullptr;
  QSpinBox* parallel_ = nullptr;
  QSpinBox* gpus_ = nullptr;
  QLineEdit* sbatch_ = nullptr;
  QDoubleSpinBox* poll_ = nullptr;
  QLabel* summary_ = nullptr;
  QPushButton* run_ = nullptr;
  QTimer* debounce_ = nullptr;
};

}  // namespace batchlens::ui
