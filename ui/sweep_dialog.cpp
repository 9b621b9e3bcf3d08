// SPDX-License-Identifier: Apache-2.0
#include "ui/sweep_dialog.h"

#include <utility>

#include <QDialogButtonBox>
#include <QDoubleSpinBox>
#include <QFileDialog>
#include <QFormLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QSpinBox>
#include <QTimer>
#include <QVBoxLayout>

#include "ui/qt_text.h"

namespace batchlens::ui {

SweepDialog::SweepDialog(experiment::ExperimentSpec base, const QString& where, bool remote,
                         QWidget* parent)
    : QDialog(parent), base_(std::move(base)) {
  setObjectName(QStringLiteral("SweepDialog"));
  setWindowTitle(tr("Run sweep"));
  auto* intro = new QLabel(
      tr("The Run panel's experiment (model, batch sizes, policy, workaround, steps) over many "
         "prompts and seeds: per item and batch size, whether row 0's text changed and where it "
         "first diverged. Runs on <b>%1</b>. Each finished item is kept: the same sweep again "
         "skips what is done.")
          .arg(where.toHtmlEscaped()),
      this);
  intro->setWordWrap(true);

  prompts_ = new QLineEdit(this);
  prompts_->setObjectName(QStringLiteral("SweepPromptsEdit"));
  prompts_->setPlaceholderText(tr("empty: the Run panel's prompt alone"));
  prompts_->setToolTip(
      tr("A prompt file here: one prompt per line, or JSON Lines with "
         "\"prompt\" or \"prompt_ids\" and an optional \"chat_template\""));
  auto* browse = new QPushButton(tr("&Browse…"), this);
  connect(browse, &QPushButton::clicked, this, &SweepDialog::browsePrompts);
  auto* prompt_row = new QHBoxLayout;
  prompt_row->addWidget(prompts_, 1);
  prompt_row->addWidget(browse);
  seeds_ = new QLineEdit(QStringLiteral("0-3"), this);
  seeds_->setObjectName(QStringLiteral("SweepSeedsEdit"));
  seeds_->setToolTip(tr("Sampling seeds, e.g. 0-23 or 0,5,9-11; empty: the Run panel's seed"));
  companions_ = new QLineEdit(this);
  companions_->setObjectName(QStringLiteral("SweepCompanionsEdit"));
  companions_->setPlaceholderText(tr("optional, e.g. none,short.txt,long.jsonl"));
  companions_->setToolTip(
      tr("An axis of the sweep: companions files here, comma-separated, 'none' for identical "
         "rows; every item runs beside each set. Empty: the Run panel's companions"));
  rows_ = new QLineEdit(this);
  rows_->setObjectName(QStringLiteral("SweepRowsEdit"));
  rows_->setPlaceholderText(tr("optional, e.g. 0,3"));
  rows_->setToolTip(
      tr("An axis of the sweep: the rows that hold the prompt under test; empty: "
         "the Run panel's row"));
  auto* form = new QFormLayout;
  form->addRow(tr("Prompts"), prompt_row);
  form->addRow(tr("Seeds"), seeds_);
  form->addRow(tr("Companion sets"), companions_);
  form->addRow(tr("Rows under test"), rows_);

  slurm_box_ = new QGroupBox(tr("Submit to Slurm on the target (a login node)"), this);
  slurm_box_->setObjectName(QStringLiteral("SweepSlurmBox"));
  slurm_box_->setCheckable(true);
  slurm_box_->setChecked(false);
  slurm_box_->setEnabled(remote);
  slurm_box_->setToolTip(
      remote ? tr("The sweep becomes a job array (one task per shard) and a merge job there, "
                  "followed from here until the merged file comes back. Cancel cancels the "
                  "jobs (scancel); a dropped connection leaves them running, and the same "
                  "sweep again follows them. The sweep folder must be on storage the nodes see.")
             : tr("Choose a device of an SSH target in the Run panel to submit to its Slurm"));
  shards_ = new QSpinBox(slurm_box_);
  shards_->setObjectName(QStringLiteral("SweepShardsSpin"));
  shards_->setRange(0, 100000);
  shards_->setSpecialValueText(tr("one per item (at most 100)"));
  shards_->setToolTip(tr("Array tasks; each loads the model once and runs its items"));
  parallel_ = new QSpinBox(slurm_box_);
  parallel_->setRange(0, 100000);
  parallel_->setSpecialValueText(tr("Slurm's choice"));
  parallel_->setToolTip(tr("At most this many tasks at once (#SBATCH --array=0-(N-1)%K)"));
  gpus_ = new QSpinBox(slurm_box_);
  gpus_->setObjectName(QStringLiteral("SweepGpusSpin"));
  gpus_->setRange(0, 64);
  gpus_->setValue(1);
  gpus_->setToolTip(tr("--gres=gpu:N per task; 0 for CPU nodes"));
  sbatch_ = new QLineEdit(slurm_box_);
  sbatch_->setObjectName(QStringLiteral("SweepSbatchEdit"));
  sbatch_->setPlaceholderText(tr("optional, e.g. --partition=gpu; --time=02:00:00"));
  sbatch_->setToolTip(tr("Extra #SBATCH lines, separated by ';'"));
  poll_ = new QDoubleSpinBox(slurm_box_);
  poll_->setRange(0.1, 3600.0);
  poll_->setValue(20.0);
  poll_->setSuffix(tr(" s"));
  poll_->setToolTip(tr("Seconds between squeue calls there"));
  auto* slurm_form = new QFormLayout(slurm_box_);
  slurm_form->addRow(tr("Tasks"), shards_);
  slurm_form->addRow(tr("At once"), parallel_);
  slurm_form->addRow(tr("GPUs per task"), gpus_);
  slurm_form->addRow(tr("sbatch options"), sbatch_);
  slurm_form->addRow(tr("Poll every"), poll_);

  summary_ = new QLabel(this);
  summary_->setObjectName(QStringLiteral("SweepSummaryLabel"));
  summary_->setWordWrap(true);
  summary_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Cancel, this);
  run_ = buttons->addButton(tr("&Run sweep"), QDialogButtonBox::AcceptRole);
  run_->setObjectName(QStringLiteral("SweepRunButton"));
  connect(buttons, &QDialogButtonBox::accepted, this, &QDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);

  auto* layout = new QVBoxLayout(this);
  layout->addWidget(intro);
  layout->addLayout(form);
  layout->addWidget(slurm_box_);
  layout->addWidget(summary_);
  layout->addWidget(buttons);

  debounce_ = new QTimer(this);
  debounce_->setSingleShot(true);
  debounce_->setInterval(250);
  connect(debounce_, &QTimer::timeout, this, &SweepDialog::refresh);
  for (QLineEdit* edit : {prompts_, seeds_, companions_, rows_}) {
    connect(edit, &QLineEdit::textChanged, debounce_, qOverload<>(&QTimer::start));
  }
  refresh();
}

SweepDialog::~SweepDialog() = default;

base::Result<analysis::SweepSpec> SweepDialog::sweep() const {
  analysis::SweepInput in;
  in.base = base_;
  in.prompts_file = prompts_->text().trimmed().toStdString();
  in.seeds = seeds_->text().trimmed().toStdString();
  in.companion_sets = companions_->text().trimmed().toStdString();
  in.rows = rows_->text().remove(QLatin1Char(' ')).toStdString();
  return analysis::sweep_from_input(in);
}

std::optional<remote::SlurmSubmit> SweepDialog::slurm() const {
  if (!slurm_box_->isEnabled() || !slurm_box_->isChecked()) {
    return std::nullopt;
  }
  remote::SlurmSubmit s;
  s.shards = shards_->value();
  s.array_parallel = parallel_->value();
  s.gpus_per_task = gpus_->value();
  s.poll_s = poll_->value();
  for (const QString& opt : sbatch_->text().split(QLatin1Char(';'), Qt::SkipEmptyParts)) {
    if (!opt.trimmed().isEmpty()) {
      s.sbatch_options.push_back(opt.trimmed().toStdString());
    }
  }
  return s;
}

void SweepDialog::refresh() {
  debounce_->stop();
  const auto s = sweep();
  run_->setEnabled(s.ok());
  if (!s.ok()) {
    summary_->setText(tr("Cannot run: %1").arg(q(s.error().message)));
    return;
  }
  const analysis::SweepSpec& sw = s.value();
  const auto items = analysis::sweep_items(sw);
  QString sizes;
  for (const std::int64_t b : sw.base.batch_sizes) {
    sizes += (sizes.isEmpty() ? QString() : QStringLiteral(", ")) + QString::number(b);
  }
  summary_->setText(tr("%n item(s): %1 prompt(s) × %2 seed(s)%3, each at B=1 and %4 (sweep %5)",
                       nullptr, static_cast<int>(items.size()))
                        .arg(sw.prompts.size())
                        .arg(sw.seeds.size())
                        .arg(sw.mixed() ? tr(" × %1 companion set(s) × %2 row(s)")
                                              .arg(sw.companion_sets.size())
                                              .arg(sw.rows.size())
                                        : QString())
                        .arg(sizes, q(analysis::sweep_id(sw).substr(0, 12))));
}

void SweepDialog::browsePrompts() {
  const QString file =
      QFileDialog::getOpenFileName(this, tr("Prompt file"), prompts_->text(),
                                   tr("Prompt files (*.txt *.jsonl *.json);;All files (*)"));
  if (!file.isEmpty()) {
    prompts_->setText(file);
    refresh();
  }
}

}  // namespace batchlens::ui
