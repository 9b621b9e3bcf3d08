// SPDX-License-Identifier: Apache-2.0
#include "ui/run_panel.h"

#include <cmath>

#include <QCheckBox>
#include <QComboBox>
#include <QFileDialog>
#include <QFormLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QKeySequence>
#include <QLabel>
#include <QLineEdit>
#include <QPlainTextEdit>
#include <QProgressBar>
#include <QPushButton>
#include <QSettings>
#include <QSpinBox>
#include <QTableWidget>
#include <QVBoxLayout>

#include "core/ops/op_family.h"

namespace batchlens::ui {

namespace {

enum OpColumn { OpFamilyColumn, OpFirstColumn, OpLastColumn, OpColumnCount };

QString q(std::string_view s) {
  return QString::fromUtf8(s.data(), static_cast<int>(s.size()));
}

QComboBox* combo(QWidget* parent, const QStringList& items, const QString& tooltip) {
  auto* c = new QComboBox(parent);
  c->addItems(items);
  c->setToolTip(tooltip);
  return c;
}

QSpinBox* spin(QWidget* parent, int min, int max, int value, const QString& tooltip) {
  auto* s = new QSpinBox(parent);
  s->setRange(min, max);
  s->setValue(value);
  s->setToolTip(tooltip);
  return s;
}

void selectText(QComboBox* c, const QString& text) {
  const int i = c->findText(text);
  if (i >= 0) {
    c->setCurrentIndex(i);
  }
}

}  // namespace

QString formatDuration(double seconds) {
  if (seconds < 0 || !std::isfinite(seconds)) {
    return QStringLiteral("?");
  }
  const auto s = static_cast<long long>(std::llround(seconds));
  if (s >= 3600) {
    return QStringLiteral("%1:%2:%3")
        .arg(s / 3600)
        .arg((s / 60) % 60, 2, 10, QLatin1Char('0'))
        .arg(s % 60, 2, 10, QLatin1Char('0'));
  }
  return QStringLiteral("%1:%2").arg(s / 60).arg(s % 60, 2, 10, QLatin1Char('0'));
}

RunPanel::RunPanel(const base::SystemInfo& system, QWidget* parent) : QWidget(parent) {
  setObjectName(QStringLiteral("RunPanel"));

  // Model.
  preset_ = combo(this,
                  {QStringLiteral("demo"), QStringLiteral("tiny"), QStringLiteral("mid"),
                   QStringLiteral("26b-a4b"), tr("checkpoint directory")},
                  tr("A preset architecture with seeded random weights, or an HF checkpoint "
                     "directory (config.json + safetensors)"));
  preset_->setObjectName(QStringLiteral("PresetCombo"));
  checkpoint_ = new QLineEdit(this);
  checkpoint_->setObjectName(QStringLiteral("CheckpointEdit"));
  checkpoint_->setPlaceholderText(tr("/path/to/checkpoint"));
  browse_ = new QPushButton(tr("Browse…"), this);
  auto* ckpt_row = new QHBoxLayout;
  ckpt_row->addWidget(checkpoint_, 1);
  ckpt_row->addWidget(browse_);
  device_ = new QComboBox(this);
  device_->setObjectName(QStringLiteral("DeviceCombo"));
  device_->addItem(tr("CPU"), QStringLiteral("cpu"));
  for (const auto& gpu : system.gpus) {
    device_->addItem(QStringLiteral("cuda:%1 %2").arg(gpu.index).arg(q(gpu.name)),
                     QStringLiteral("cuda:%1").arg(gpu.index));
  }
  device_->setToolTip(system.cuda_build ? tr("CPU or a CUDA device found on this machine")
                                        : tr("This build has no CUDA: CPU only"));
  dtype_ = combo(this, {QStringLiteral("bf16"), QStringLiteral("fp32")},
                 tr("bf16 as released; fp32 only on the CPU (its GEMMs are not batch invariant "
                    "here: a real, non-emulated source of divergence)"));
  experts_ = combo(this, {QStringLiteral("eager"), QStringLiteral("grouped_mm")},
                   tr("How the MoE experts are computed: the per-expert loop or one grouped GEMM "
                      "(the user's setting on GPUs)"));

  // Prompt and sampling.
  prompt_ = new QPlainTextEdit(this);
  prompt_->setObjectName(QStringLiteral("PromptEdit"));
  prompt_->setPlainText(QStringLiteral("Write a long essay about Portugal."));
  prompt_->setMaximumHeight(70);
  chat_ = new QCheckBox(tr("Chat template"), this);
  chat_->setChecked(true);
  chat_->setToolTip(tr("Wrap the prompt in Gemma's chat template"));
  batch_sizes_ = new QLineEdit(QStringLiteral("2,3,4"), this);
  batch_sizes_->setObjectName(QStringLiteral("BatchSizesEdit"));
  batch_sizes_->setToolTip(tr("Batch sizes whose row 0 is compared with the B=1 reference"));
  repeats_ = spin(this, 0, 8, 1, tr("Extra B=1 runs: the noise floor (should be identical)"));
  steps_ = spin(this, 1, 1000, 48, tr("Denoising steps per canvas (max_denoising_steps)"));
  steps_->setObjectName(QStringLiteral("StepsSpin"));
  max_new_tokens_ = spin(this, 1, 32768, 64, tr("New tokens to generate (max_new_tokens)"));
  max_new_tokens_->setObjectName(QStringLiteral("MaxNewTokensSpin"));
  seed_ = spin(this, 0, 2147483647, 0, tr("Sampling seed"));
  rng_ = combo(this, {QStringLiteral("per_row"), QStringLiteral("shared")},
               tr("per_row: each row draws from its own stream, so row 0 draws the same numbers "
                  "at every batch size; shared: one stream for the batch (as transformers)"));
  prefill_ = combo(this, {QStringLiteral("copied"), QStringLiteral("batched")},
                   tr("copied: the prompt cache is computed at B=1 and copied to every row; "
                      "batched: prefilled at the batch size"));
  mode_ = combo(this, {QStringLiteral("free"), QStringLiteral("lockstep")},
                tr("free: every run follows its own trajectory; lockstep: runs adopt the "
                   "reference's canvas each step, so numerics are compared on equal inputs"));
  policy_ = combo(this, {QStringLiteral("default"), QStringLiteral("emulated_split_k")},
                  tr("default: kernels as transformers calls them; emulated_split_k: a CPU "
                     "EMULATION of GPU GEMMs choosing the K split by batch shape"));
  policy_->setObjectName(QStringLiteral("PolicyCombo"));
  policy_->setCurrentText(QStringLiteral("emulated_split_k"));

  // Workaround.
  workaround_ = new QCheckBox(tr("Apply row-wise workaround"), this);
  workaround_->setObjectName(QStringLiteral("WorkaroundCheck"));
  workaround_->setToolTip(
      tr("Run every batch size again with the checked op families computed "
         "one row at a time, and show the result beside the one without"));
  ops_ = new QTableWidget(ops::kOpFamilyCount, OpColumnCount, this);
  ops_->setObjectName(QStringLiteral("WorkaroundOps"));
  ops_->setHorizontalHeaderLabels({tr("Row-wise op family"), tr("First layer"), tr("Last layer")});
  ops_->verticalHeader()->hide();
  ops_->horizontalHeader()->setSectionResizeMode(OpFamilyColumn, QHeaderView::Stretch);
  ops_->setToolTip(
      tr("Families computed row-wise and their layer range (last -1: through the "
         "last layer; per-step families ignore the range)"));
  for (int f = 0; f < ops::kOpFamilyCount; ++f) {
    auto* item = new QTableWidgetItem(q(ops::family_name(static_cast<ops::OpFamily>(f))));
    item->setFlags(Qt::ItemIsEnabled | Qt::ItemIsUserCheckable);
    item->setCheckState(Qt::Unchecked);
    ops_->setItem(f, OpFamilyColumn, item);
    ops_->setCellWidget(f, OpFirstColumn, spin(ops_, 0, 1000, 0, tr("first layer (inclusive)")));
    ops_->setCellWidget(f, OpLastColumn,
                        spin(ops_, -1, 1000, -1, tr("last layer (inclusive); -1: the last")));
  }
  ops_->setMinimumHeight(150);
  preset_ops_ = new QPushButton(tr("Issue preset"), this);
  preset_ops_->setToolTip(tr("Router projection + self-conditioning matmul, all layers"));
  resetWorkaroundToPreset();

  run_ = new QPushButton(tr("Run"), this);
  run_->setObjectName(QStringLiteral("RunButton"));
  run_->setDefault(true);
  run_->setToolTip(tr("Run the paired batch-size experiment (Ctrl+R)"));
  run_->setShortcut(QKeySequence(QStringLiteral("Ctrl+R")));
  cancel_ = new QPushButton(tr("Cancel"), this);
  cancel_->setObjectName(QStringLiteral("CancelButton"));
  cancel_->setEnabled(false);
  cancel_->setToolTip(tr("Stop the run; the result shown stays as it is"));
  progress_ = new QProgressBar(this);
  progress_->setObjectName(QStringLiteral("RunProgress"));
  progress_->setRange(0, 1000);
  progress_->setValue(0);
  progress_->setTextVisible(true);
  progress_->setFormat(tr("idle"));
  status_ = new QLabel(this);
  status_->setObjectName(QStringLiteral("RunStatus"));
  status_->setWordWrap(true);

  auto* model_box = new QGroupBox(tr("Model"), this);
  auto* model_form = new QFormLayout(model_box);
  model_form->addRow(tr("Preset"), preset_);
  model_form->addRow(tr("Checkpoint"), ckpt_row);
  model_form->addRow(tr("Device"), device_);
  model_form->addRow(tr("Precision"), dtype_);
  model_form->addRow(tr("Experts"), experts_);

  auto* run_box = new QGroupBox(tr("Experiment"), this);
  auto* run_form = new QFormLayout(run_box);
  run_form->addRow(tr("Prompt"), prompt_);
  run_form->addRow(QString(), chat_);
  run_form->addRow(tr("Batch sizes"), batch_sizes_);
  run_form->addRow(tr("B=1 repeats"), repeats_);
  run_form->addRow(tr("Steps"), steps_);
  run_form->addRow(tr("New tokens"), max_new_tokens_);
  run_form->addRow(tr("Seed"), seed_);
  run_form->addRow(tr("RNG"), rng_);
  run_form->addRow(tr("Prefill"), prefill_);
  run_form->addRow(tr("Comparison"), mode_);
  run_form->addRow(tr("Kernels"), policy_);

  auto* wa_box = new QGroupBox(tr("Workaround"), this);
  auto* wa_layout = new QVBoxLayout(wa_box);
  auto* wa_row = new QHBoxLayout;
  wa_row->addWidget(workaround_, 1);
  wa_row->addWidget(preset_ops_);
  wa_layout->addLayout(wa_row);
  wa_layout->addWidget(ops_);

  auto* buttons = new QHBoxLayout;
  buttons->addWidget(run_, 1);
  buttons->addWidget(cancel_);

  auto* layout = new QVBoxLayout(this);
  layout->addWidget(model_box);
  layout->addWidget(run_box);
  layout->addWidget(wa_box, 1);
  layout->addLayout(buttons);
  layout->addWidget(progress_);
  layout->addWidget(status_);

  connect(preset_, &QComboBox::currentIndexChanged, this, &RunPanel::updateModelFields);
  connect(device_, &QComboBox::currentIndexChanged, this, &RunPanel::updateModelFields);
  connect(browse_, &QPushButton::clicked, this, [this] {
    const QString dir =
        QFileDialog::getExistingDirectory(this, tr("Checkpoint directory"), checkpoint_->text());
    if (!dir.isEmpty()) {
      checkpoint_->setText(dir);
    }
  });
  connect(preset_ops_, &QPushButton::clicked, this, &RunPanel::resetWorkaroundToPreset);
  connect(run_, &QPushButton::clicked, this, &RunPanel::requestRun);
  connect(cancel_, &QPushButton::clicked, this, &RunPanel::cancelRequested);
  connect(workaround_, &QCheckBox::toggled, this, &RunPanel::workaroundToggled);
  updateModelFields();
}

void RunPanel::updateModelFields() {
  const bool checkpoint = preset_->currentIndex() == preset_->count() - 1;
  checkpoint_->setEnabled(checkpoint);
  browse_->setEnabled(checkpoint);
  const bool cpu = device_->currentData().toString() == QStringLiteral("cpu");
  // The emulation and fp32 are CPU-only (core refuses them elsewhere); say so in the form.
  if (!cpu) {
    if (policy_->currentText() == QStringLiteral("emulated_split_k")) {
      policy_->setCurrentText(QStringLiteral("default"));
    }
    dtype_->setCurrentText(QStringLiteral("bf16"));
  }
  dtype_->setEnabled(cpu);
  policy_->setEnabled(cpu);
}

base::Result<experiment::ExperimentSpec> RunPanel::spec() const {
  experiment::ExperimentSpec s;
  if (preset_->currentIndex() == preset_->count() - 1) {
    if (checkpoint_->text().trimmed().isEmpty()) {
      return base::Error{base::ErrorCode::InvalidArgument, "choose a checkpoint directory"};
    }
    s.model.checkpoint_dir = checkpoint_->text().trimmed().toStdString();
  } else {
    s.model.preset = preset_->currentText().toStdString();
  }
  s.load.device = device_->currentData().toString().toStdString();
  s.load.dtype = dtype_->currentText().toStdString();
  s.load.experts = experts_->currentText().toStdString();
  s.prompt = prompt_->toPlainText().toStdString();
  s.chat_template = chat_->isChecked();
  s.batch_sizes.clear();
  for (const QString& part : batch_sizes_->text().split(QLatin1Char(','), Qt::SkipEmptyParts)) {
    bool ok = false;
    const int b = part.trimmed().toInt(&ok);
    if (!ok) {
      return base::Error{base::ErrorCode::InvalidArgument,
                         "batch sizes: '" + part.trimmed().toStdString() +
                             "' is not a number (expected e.g. 2,3,4)"};
    }
    s.batch_sizes.push_back(b);
  }
  s.repeats = repeats_->value();
  s.overrides.max_denoising_steps = steps_->value();
  s.overrides.max_new_tokens = max_new_tokens_->value();
  s.seed = static_cast<std::uint64_t>(seed_->value());
  const auto rng = generation::parse_rng_mode(rng_->currentText().toStdString());
  const auto prefill = generation::parse_prefill_mode(prefill_->currentText().toStdString());
  const auto mode = experiment::parse_run_mode(mode_->currentText().toStdString());
  for (const base::Error* e :
       {rng.ok() ? nullptr : &rng.error(), prefill.ok() ? nullptr : &prefill.error(),
        mode.ok() ? nullptr : &mode.error()}) {
    if (e != nullptr) {
      return *e;
    }
  }
  s.rng = rng.value();
  s.prefill = prefill.value();
  s.mode = mode.value();
  auto policy = ops::policy_from_text(policy_->currentText().toStdString());
  if (!policy.ok()) {
    return policy.error();
  }
  s.policy = std::move(policy).value();
  if (workaround_->isChecked()) {
    s.workaround = workaroundPolicy();
    if (s.workaround->rules.empty()) {
      return base::Error{base::ErrorCode::InvalidArgument,
                         "the workaround is on but no op family is checked"};
    }
  }
  if (auto valid = experiment::validate(s); !valid.ok()) {
    return valid.error();
  }
  return s;
}

void RunPanel::setSpec(const experiment::ExperimentSpec& s) {
  if (!s.model.preset.empty()) {
    selectText(preset_, QString::fromStdString(s.model.preset));
  } else {
    preset_->setCurrentIndex(preset_->count() - 1);
    checkpoint_->setText(QString::fromStdString(s.model.checkpoint_dir.string()));
  }
  const int device = device_->findData(
      QString::fromStdString(s.load.device == "cuda" ? std::string("cuda:0") : s.load.device));
  device_->setCurrentIndex(device >= 0 ? device : 0);
  selectText(experts_, QString::fromStdString(s.load.experts));
  selectText(dtype_, QString::fromStdString(s.load.dtype));
  prompt_->setPlainText(QString::fromStdString(s.prompt));
  chat_->setChecked(s.chat_template);
  QStringList sizes;
  for (auto b : s.batch_sizes) {
    sizes << QString::number(b);
  }
  batch_sizes_->setText(sizes.join(QLatin1Char(',')));
  repeats_->setValue(s.repeats);
  if (s.overrides.max_denoising_steps) {
    steps_->setValue(*s.overrides.max_denoising_steps);
  }
  if (s.overrides.max_new_tokens) {
    max_new_tokens_->setValue(static_cast<int>(*s.overrides.max_new_tokens));
  }
  seed_->setValue(static_cast<int>(s.seed));
  selectText(rng_, QString::fromLatin1(generation::name(s.rng)));
  selectText(prefill_, QString::fromLatin1(generation::name(s.prefill)));
  selectText(mode_, QString::fromLatin1(experiment::name(s.mode)));
  selectText(policy_, q(ops::policy_text(s.policy)));
  updateModelFields();
}

ops::OpPolicy RunPanel::workaroundPolicy() const {
  ops::OpPolicy custom;
  custom.name = "custom_row_wise";
  ops::FamilySet everywhere;  // families checked for every layer
  for (int f = 0; f < ops::kOpFamilyCount; ++f) {
    if (ops_->item(f, OpFamilyColumn)->checkState() != Qt::Checked) {
      continue;
    }
    const int first = qobject_cast<QSpinBox*>(ops_->cellWidget(f, OpFirstColumn))->value();
    const int last = qobject_cast<QSpinBox*>(ops_->cellWidget(f, OpLastColumn))->value();
    ops::FamilySet family;
    family.set(static_cast<std::size_t>(f));
    custom.rules.push_back({family, first, last, ops::Strategy::RowWise});
    if (first == 0 && last == -1) {
      everywhere |= family;
    }
  }
  ops::OpPolicy preset = ops::OpPolicy::issue_workaround();
  const bool whole = everywhere.count() == custom.rules.size();
  if (whole && ops::OpPolicy::row_wise(everywhere, preset.name) == preset) {
    return preset;
  }
  return custom;
}

bool RunPanel::workaroundEnabled() const {
  return workaround_->isChecked();
}

void RunPanel::setWorkaroundEnabled(bool on) {
  const QSignalBlocker block(workaround_);
  workaround_->setChecked(on);
}

void RunPanel::resetWorkaroundToPreset() {
  showWorkaroundPolicy(ops::OpPolicy::issue_workaround());
}

void RunPanel::showWorkaroundPolicy(const ops::OpPolicy& policy) {
  for (int f = 0; f < ops::kOpFamilyCount; ++f) {
    setWorkaroundFamily(ops_->item(f, OpFamilyColumn)->text(), false);
  }
  for (const ops::PolicyRule& rule : policy.rules) {
    if (rule.strategy != ops::Strategy::RowWise) {
      continue;
    }
    for (int f = 0; f < ops::kOpFamilyCount; ++f) {
      if (rule.families.test(static_cast<std::size_t>(f))) {
        setWorkaroundFamily(q(ops::family_name(static_cast<ops::OpFamily>(f))), true,
                            rule.first_layer, rule.last_layer);
      }
    }
  }
}

void RunPanel::setWorkaroundFamily(const QString& family, bool on, int first, int last) {
  for (int f = 0; f < ops::kOpFamilyCount; ++f) {
    if (ops_->item(f, OpFamilyColumn)->text() == family) {
      ops_->item(f, OpFamilyColumn)->setCheckState(on ? Qt::Checked : Qt::Unchecked);
      qobject_cast<QSpinBox*>(ops_->cellWidget(f, OpFirstColumn))->setValue(first);
      qobject_cast<QSpinBox*>(ops_->cellWidget(f, OpLastColumn))->setValue(last);
    }
  }
}

void RunPanel::requestRun() {
  auto s = spec();
  if (!s.ok()) {
    showMessage(tr("Cannot run: %1").arg(QString::fromStdString(s.error().message)));
    return;
  }
  Q_EMIT runRequested(s.value());
}

void RunPanel::setRunning(bool running) {
  run_->setEnabled(!running);
  cancel_->setEnabled(running);
  if (running) {
    progress_->setValue(0);
    progress_->setFormat(tr("starting…"));
  } else {
    progress_->setFormat(tr("idle"));
  }
}

void RunPanel::showProgress(const base::Progress& p) {
  if (p.total > 0) {
    progress_->setRange(0, 1000);
    progress_->setValue(static_cast<int>(std::lround(1000.0 * p.fraction())));
    progress_->setFormat(tr("%1/%2 steps · %3 · ETA %4")
                             .arg(p.done)
                             .arg(p.total)
                             .arg(QString::fromStdString(p.stage))
                             .arg(formatDuration(p.eta_s)));
  } else {
    progress_->setRange(0, 0);  // busy indicator while loading
    progress_->setFormat(QString::fromStdString(p.stage));
  }
  status_->setText(tr("%1 — elapsed %2, ETA %3")
                       .arg(QString::fromStdString(p.stage), formatDuration(p.elapsed_s),
                            formatDuration(p.eta_s)));
}

void RunPanel::showMessage(const QString& text) {
  progress_->setRange(0, 1000);
  status_->setText(text);
}

void RunPanel::saveSettings(QSettings& settings) const {
  settings.beginGroup(QStringLiteral("run"));
  settings.setValue(QStringLiteral("preset"), preset_->currentText());
  settings.setValue(QStringLiteral("checkpoint"), checkpoint_->text());
  settings.setValue(QStringLiteral("device"), device_->currentData());
  settings.setValue(QStringLiteral("dtype"), dtype_->currentText());
  settings.setValue(QStringLiteral("experts"), experts_->currentText());
  settings.setValue(QStringLiteral("prompt"), prompt_->toPlainText());
  settings.setValue(QStringLiteral("chat"), chat_->isChecked());
  settings.setValue(QStringLiteral("batchSizes"), batch_sizes_->text());
  settings.setValue(QStringLiteral("repeats"), repeats_->value());
  settings.setValue(QStringLiteral("steps"), steps_->value());
  settings.setValue(QStringLiteral("maxNewTokens"), max_new_tokens_->value());
  settings.setValue(QStringLiteral("seed"), seed_->value());
  settings.setValue(QStringLiteral("rng"), rng_->currentText());
  settings.setValue(QStringLiteral("prefill"), prefill_->currentText());
  settings.setValue(QStringLiteral("mode"), mode_->currentText());
  settings.setValue(QStringLiteral("policy"), policy_->currentText());
  settings.setValue(QStringLiteral("workaroundOps"), q(ops::policy_text(workaroundPolicy())));
  settings.endGroup();
}

void RunPanel::restoreSettings(const QSettings& settings) {
  const auto value = [&settings](const char* key) {
    return settings.value(QStringLiteral("run/") + QLatin1String(key));
  };
  if (!value("preset").isValid()) {
    return;
  }
  selectText(preset_, value("preset").toString());
  checkpoint_->setText(value("checkpoint").toString());
  const int device = device_->findData(value("device"));
  device_->setCurrentIndex(device >= 0 ? device : 0);
  selectText(dtype_, value("dtype").toString());
  selectText(experts_, value("experts").toString());
  prompt_->setPlainText(value("prompt").toString());
  chat_->setChecked(value("chat").toBool());
  batch_sizes_->setText(value("batchSizes").toString());
  repeats_->setValue(value("repeats").toInt());
  steps_->setValue(value("steps").toInt());
  max_new_tokens_->setValue(value("maxNewTokens").toInt());
  seed_->setValue(value("seed").toInt());
  selectText(rng_, value("rng").toString());
  selectText(prefill_, value("prefill").toString());
  selectText(mode_, value("mode").toString());
  selectText(policy_, value("policy").toString());
  // The op list as saved (the preset's name or policy JSON); the preset when unreadable.
  const auto saved = ops::policy_from_text(value("workaroundOps").toString().toStdString());
  showWorkaroundPolicy(saved.ok() ? saved.value() : ops::OpPolicy::issue_workaround());
  updateModelFields();
}

}  // namespace batchlens::ui
