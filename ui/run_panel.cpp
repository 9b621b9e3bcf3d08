// SPDX-License-Identifier: Apache-2.0
#include "ui/run_panel.h"

#include <algorithm>
#include <cmath>

#include <QCheckBox>
#include <QComboBox>
#include <QDateTime>
#include <QDir>
#include <QFileDialog>
#include <QFileInfo>
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
#include <QScrollArea>
#include <QSettings>
#include <QSpinBox>
#include <QTableWidget>
#include <QVBoxLayout>

#include "core/base/system_info.h"
#include "core/experiment/plan.h"
#include "core/generation/generation_config.h"
#include "core/model/config.h"
#include "core/ops/op_family.h"
#include "core/ops/policy.h"
#include "core/setup/prompt.h"
#include "ui/qt_text.h"

namespace batchlens::ui {

namespace {

enum OpColumn { OpFamilyColumn, OpFirstColumn, OpLastColumn, OpColumnCount };

// Device items for a device this machine does not have carry true under this role.
constexpr int kMissingRole = Qt::UserRole + 1;
// Device items of an SSH target carry its index in RunPanel::targets_ under this role.
constexpr int kTargetRole = Qt::UserRole + 2;

// The run panel's settings layout; older ones are not restored (their defaults were slow, or,
// version 2, too few steps for the trained demo model to write sentences).
constexpr int kSettingsVersion = 3;

// Denoising steps per canvas of the one-click demo (docs/benchmarks.md: its duration). The
// trained model writes sentences from about 32 steps per 32-token canvas (at 12 its canvas never
// builds up: "the the the"; docs/demo-model.md).
constexpr int kDemoSteps = 32;

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

// What one decoder step of a model costs here (all engines' work per step, comparisons
// included), and loading it.
struct StepCost {
  double seconds_per_step = 0;
  double load_s = 0;      ///< building or loading the model
  double kernels_s = 0;   ///< recording kernel provenance (when the spec asks for it)
  bool measured = false;  ///< from a run on this machine, else calibrated
};

// Calibrated on a 2-core AMD EPYC without AVX-512 (ATEN_CPU_CAPABILITY=avx2, oneDNN AVX2), bf16,
// the one-click demo's spec (docs/benchmarks.md: 84 engine steps in 2.1 s, twice that here for
// slower or busy machines); measured runs here replace them.
constexpr double kDemoStepSeconds = 0.05;
constexpr double kTinyStepSeconds = 0.02;
constexpr double kDemoTrainedStepSeconds = 0.08;  // 42 ms measured idle (AVX-512), doubled
constexpr double kCalibratedLoadSeconds = 0.5;
constexpr double kCalibratedKernelsSeconds = 0.8;  // 0.41 s measured idle, doubled

// The machine a measured cost belongs to (one settings file can serve several machines, e.g. a
// shared home): the CPU's model, the kernel sets LibTorch uses on it and its threads. Set from
// the SystemInfo the window was given (no second probe of the machine).
QString& machineKey() {
  static QString key = QStringLiteral("unknown");
  return key;
}

QString machineKeyOf(const base::SystemInfo& system) {
  QString k =
      QStringLiteral("%1_%2_%3_%4t")
          .arg(q(system.cpu_model), q(system.cpu_isa.aten_capability), q(system.cpu_isa.onednn_isa))
          .arg(system.torch_threads);
  for (QChar& c : k) {
    if (!c.isLetterOrNumber() && c != QLatin1Char('_') && c != QLatin1Char('.')) {
      c = QLatin1Char('-');
    }
  }
  return k;
}

QString costKey(const experiment::ExperimentSpec& s) {
  return QStringLiteral("estimate/%1/%2_%3_%4_%5")
      .arg(machineKey(), s.model.preset.empty() ? QStringLiteral("checkpoint") : q(s.model.preset),
           q(s.load.device), q(s.load.dtype), q(s.load.experts))
      .replace(QLatin1Char(':'), QLatin1Char('-'));
}

StepCost stepCost(const experiment::ExperimentSpec& s) {
  const QStringList saved = QSettings().value(costKey(s)).toStringList();
  if (saved.size() == 3 && saved[0].toDouble() > 0) {
    return {saved[0].toDouble(), saved[1].toDouble(), saved[2].toDouble(), true};
  }
  if (s.load.device == "cpu" && s.load.dtype == "bf16") {
    if (s.model.preset == "demo") {
      return {kDemoStepSeconds, kCalibratedLoadSeconds, kCalibratedKernelsSeconds, false};
    }
    if (s.model.preset == "demo-trained") {
      return {kDemoTrainedStepSeconds, kCalibratedLoadSeconds, kCalibratedKernelsSeconds, false};
    }
    if (s.model.preset == "tiny") {
      return {kTinyStepSeconds, kCalibratedLoadSeconds, kCalibratedKernelsSeconds, false};
    }
  }
  return {};
}

// Model build, kernel recording when asked for, and the decoder passes.
double expectedTotal(const experiment::ExperimentSpec& s, const StepCost& cost,
                     std::int64_t engine_steps) {
  return cost.load_s + (s.kernels ? cost.kernels_s : 0.0) +
         static_cast<double>(engine_steps) * cost.seconds_per_step;
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

experiment::ExperimentSpec defaultDemoSpec() {
  experiment::ExperimentSpec s;
  // The bundled trained model (tools/train_demo, docs/demo-model.md): texts in words, so a
  // changed token reads as one; a verse as the prompt, as it was trained on (this one: B=2
  // and 4 change 8 of 32 tokens under emulated_h200, the workaround none).
  s.model.preset = "demo-trained";
  s.prompt = "In the beginning God created the heaven and the earth.";
  s.load.device = "cpu";
  s.batch_sizes = {2, 4};
  s.repeats = 1;
  s.overrides.max_denoising_steps = kDemoSteps;
  s.overrides.max_new_tokens = 32;  // the demo's canvas: one canvas
  s.policy = ops::OpPolicy::emulation_profile("emulated_h200");
  s.kernels = true;
  return s;
}

RunPanel::RunPanel(const base::SystemInfo& system, QWidget* parent) : QWidget(parent) {
  setObjectName(QStringLiteral("RunPanel"));
  machineKey() = machineKeyOf(system);
  const experiment::ExperimentSpec demo = defaultDemoSpec();
  createModelFields(system, demo);
  createSamplingFields(demo);
  createWorkaroundFields();
  createFooter();
  connectFields();
  updateModelFields();
  updateProfileNote();
  updateEstimate();
}

void RunPanel::createModelFields(const base::SystemInfo& system,
                                 const experiment::ExperimentSpec& demo) {
  // Model.
  // The shipped presets (the one-click default first), then a checkpoint directory: last.
  QStringList presets{QString::fromStdString(demo.model.preset)};
  for (const std::string& name : model::preset_names()) {
    if (name != demo.model.preset) {
      presets << QString::fromStdString(name);
    }
  }
  preset_ = combo(this, presets << tr("checkpoint directory"),
                  tr("A shipped preset (an architecture with seeded random weights, or a small "
                     "trained model bundled with BatchLens), or an HF checkpoint directory "
                     "(config.json + safetensors)"));
  preset_->setObjectName(QStringLiteral("PresetCombo"));
  checkpoint_ = new QLineEdit(this);
  checkpoint_->setObjectName(QStringLiteral("CheckpointEdit"));
  checkpoint_->setPlaceholderText(tr("/path/to/checkpoint"));
  browse_ = new QPushButton(tr("Browse…"), this);
  device_ = new QComboBox(this);
  device_->setObjectName(QStringLiteral("DeviceCombo"));
  device_->addItem(tr("CPU"), QStringLiteral("cpu"));
  for (const auto& gpu : system.gpus) {
    device_->addItem(QStringLiteral("cuda:%1 %2").arg(gpu.index).arg(q(gpu.name)),
                     QStringLiteral("cuda:%1").arg(gpu.index));
  }
  device_->setToolTip(system.cuda_build
                          ? tr("CPU or a CUDA device found on this machine, or a device of an "
                               "SSH target (SSH targets…)")
                          : tr("This build has no CUDA: CPU here, or a device of an SSH target "
                               "(a GPU server: SSH targets…)"));
  targets_button_ = new QPushButton(tr("SSH targets…"), this);
  targets_button_->setObjectName(QStringLiteral("TargetsButton"));
  targets_button_->setToolTip(
      tr("Add GPU servers reached over SSH: their devices join this list, runs on them come "
         "back here as files"));
  device_note_ = new QLabel(this);
  device_note_->setObjectName(QStringLiteral("DeviceNote"));
  device_note_->setWordWrap(true);
  device_note_->setStyleSheet(QStringLiteral("color:#a50026;"));
  device_note_->hide();
  dtype_ = combo(this, {QStringLiteral("bf16"), QStringLiteral("fp32")},
                 tr("bf16 as released; fp32 only on the CPU (its GEMMs are not batch invariant "
                    "here: a real, non-emulated source of divergence)"));
  experts_ = combo(this, {QStringLiteral("eager"), QStringLiteral("grouped_mm")},
                   tr("How the MoE experts are computed: the per-expert loop or one grouped GEMM "
                      "(the user's setting on GPUs)"));
}

void RunPanel::createSamplingFields(const experiment::ExperimentSpec& demo) {
  // Prompt and sampling.
  prompt_ = new QPlainTextEdit(this);
  prompt_->setObjectName(QStringLiteral("PromptEdit"));
  prompt_->setPlainText(QString::fromStdString(demo.prompt));
  prompt_->setMaximumHeight(70);
  prompt_note_ = new QLabel(this);
  prompt_note_->setObjectName(QStringLiteral("PromptIdsNote"));
  prompt_note_->setWordWrap(true);
  prompt_note_->setStyleSheet(QStringLiteral("color:#444;"));
  prompt_note_->hide();
  chat_ = new QCheckBox(tr("Chat template"), this);
  chat_->setChecked(true);
  chat_->setToolTip(tr("Wrap the prompt in Gemma's chat template"));
  batch_sizes_ = new QLineEdit(QStringLiteral("2,4"), this);
  batch_sizes_->setObjectName(QStringLiteral("BatchSizesEdit"));
  batch_sizes_->setToolTip(tr("Batch sizes whose row 0 is compared with the B=1 reference"));
  repeats_ =
      spin(this, 0, 8, demo.repeats, tr("Extra B=1 runs: the noise floor (should be identical)"));
  steps_ = spin(this, 1, 1000, kDemoSteps, tr("Denoising steps per canvas (max_denoising_steps)"));
  steps_->setObjectName(QStringLiteral("StepsSpin"));
  max_new_tokens_ = spin(this, 1, 32768, 32,
                         tr("New tokens to generate (max_new_tokens); a canvas holds 32 tokens "
                            "in the demo preset, 256 in the others"));
  max_new_tokens_->setObjectName(QStringLiteral("MaxNewTokensSpin"));
  seed_ = spin(this, 0, 2147483647, 0, tr("Sampling seed"));
  rng_ = combo(this, {QStringLiteral("per_row"), QStringLiteral("shared")},
               tr("per_row: each row draws from its own stream, so row 0 draws the same numbers "
                  "at every batch size; shared: one stream for the batch (as transformers)"));
  prefill_ = combo(this, {QStringLiteral("copied"), QStringLiteral("batched")},
                   tr("copied: the prompt cache is computed at B=1 and copied to every row; "
                      "batched: prefilled at the batch size"));
  companions_ = new QLineEdit(this);
  companions_->setObjectName(QStringLiteral("CompanionsEdit"));
  companions_->setPlaceholderText(tr("none: every row holds the prompt"));
  companions_->setToolTip(
      tr("A file of other requests' prompts (one per line, or JSON Lines with \"prompt\"), "
         "cycled over the other rows of every batch: the batch is left-padded, masked and "
         "positioned as transformers' generate builds it. The B=1 reference is the prompt "
         "alone."));
  companions_browse_ = new QPushButton(tr("Browse…"), this);
  companions_note_ = new QLabel(this);
  companions_note_->setObjectName(QStringLiteral("CompanionsNote"));
  companions_note_->setWordWrap(true);
  companions_note_->hide();
  row_ = spin(this, 0, 1023, 0, tr("Which row of every batch holds the prompt under test"));
  row_->setObjectName(QStringLiteral("RowSpin"));
  positions_ = combo(this, {QStringLiteral("shared"), QStringLiteral("per_row")},
                     tr("Position ids of a padded batch: shared (transformers' generate: one set "
                        "from the padded length) or per_row (each row from its own mask, what a "
                        "fix would do)"));
  positions_->setObjectName(QStringLiteral("PositionsCombo"));
  positions_->setEnabled(false);  // until companions are given
  mode_ = combo(this, {QStringLiteral("free"), QStringLiteral("lockstep")},
                tr("free: every run follows its own trajectory; lockstep: runs adopt the "
                   "reference's canvas each step, so numerics are compared on equal inputs"));
  policy_ = new QComboBox(this);
  policy_->setObjectName(QStringLiteral("PolicyCombo"));
  policy_->addItem(QStringLiteral("default"), QStringLiteral("default"));
  policy_->setItemData(0, tr("Kernels as transformers calls them (no emulation)"), Qt::ToolTipRole);
  for (const ops::EmulationProfile& profile : ops::emulation_profiles()) {
    policy_->addItem(tr("%1 (EMULATION of %2)").arg(q(profile.name), q(profile.gpu)),
                     q(profile.name));
    policy_->setItemData(policy_->count() - 1, q(profile.description), Qt::ToolTipRole);
  }
  policy_->setToolTip(
      tr("Emulation profile: how the kernels compute. On a CPU the GEMMs are batch invariant, "
         "so BatchLens EMULATES a GPU's shape-dependent split-K reduction in the families that "
         "diverged on that GPU; default computes as transformers does."));
  policy_->setCurrentIndex(policy_->findData(q(ops::policy_text(demo.policy))));
  profile_note_ = new QLabel(this);
  profile_note_->setObjectName(QStringLiteral("ProfileNote"));
  profile_note_->setWordWrap(true);
  profile_note_->setTextFormat(Qt::RichText);
}

void RunPanel::createWorkaroundFields() {
  // Workaround.
  workaround_ = new QCheckBox(tr("Apply workaround"), this);
  workaround_->setObjectName(QStringLiteral("WorkaroundCheck"));
  workaround_->setToolTip(
      tr("Run the shown experiment's batch sizes again with the checked op families fixed by "
         "the chosen strategy (only the runs it lacks), and show the result beside the one "
         "without"));
  strategy_ = new QComboBox(this);
  strategy_->setObjectName(QStringLiteral("WorkaroundStrategy"));
  strategy_->addItem(tr("row-wise"), static_cast<int>(ops::Strategy::RowWise));
  strategy_->addItem(tr("batch-invariant"), static_cast<int>(ops::Strategy::BatchInvariant));
  strategy_->setToolTip(
      tr("row-wise: each checked op runs once per batch row (serialises the batch).\n"
         "batch-invariant: one call over the whole batch with a kernel whose per-row reduction "
         "order does not depend on the row count (what serving engines use).\n"
         "Also the strategy Run > Find culprit applies."));
  buildOpList();
  preset_ops_ = new QPushButton(tr("Issue preset"), this);
  preset_ops_->setToolTip(tr("Router projection + self-conditioning matmul, all layers"));
  resetWorkaroundToPreset();
}

// The form in its scroll area, and the footer: always in view, whatever the form's height.
void RunPanel::createFooter() {
  run_ = new QPushButton(tr("Run"), this);
  run_->setObjectName(QStringLiteral("RunButton"));
  run_->setDefault(true);
  run_->setToolTip(tr("Run the paired batch-size experiment (Ctrl+R)"));
  run_->setShortcut(QKeySequence(QStringLiteral("Ctrl+R")));
  cancel_ = new QPushButton(tr("Cancel"), this);
  cancel_->setObjectName(QStringLiteral("CancelButton"));
  cancel_->setEnabled(false);
  cancel_->setToolTip(tr("Stop the run; the result shown stays as it is"));
  expected_ = new QLabel(this);
  expected_->setObjectName(QStringLiteral("ExpectedDuration"));
  expected_->setWordWrap(true);
  progress_ = new QProgressBar(this);
  progress_->setObjectName(QStringLiteral("RunProgress"));
  progress_->setRange(0, 1000);
  progress_->setValue(0);
  progress_->setTextVisible(true);
  progress_->setFormat(tr("idle"));
  status_ = new QLabel(this);
  status_->setObjectName(QStringLiteral("RunStatus"));
  status_->setWordWrap(true);

  scroll_ = new QScrollArea(this);
  scroll_->setObjectName(QStringLiteral("RunFormScroll"));
  scroll_->setWidget(buildForm());
  scroll_->setWidgetResizable(true);
  scroll_->setFrameShape(QFrame::NoFrame);
  scroll_->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  auto* buttons = new QHBoxLayout;
  buttons->addWidget(run_, 1);
  buttons->addWidget(cancel_);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->addWidget(scroll_, 1);
  auto* footer = new QVBoxLayout;
  footer->setContentsMargins(6, 0, 6, 6);
  footer->addWidget(expected_);
  footer->addLayout(buttons);
  footer->addWidget(progress_);
  footer->addWidget(status_);
  layout->addLayout(footer);
}

// Each field to what follows it: model fields, the estimate, the prompt-ids note.
void RunPanel::connectFields() {
  connect(preset_, &QComboBox::currentIndexChanged, this, &RunPanel::updateModelFields);
  connect(device_, &QComboBox::currentIndexChanged, this, &RunPanel::updateModelFields);
  connect(targets_button_, &QPushButton::clicked, this, &RunPanel::targetsRequested);
  connect(policy_, &QComboBox::currentIndexChanged, this, &RunPanel::updateProfileNote);
  connect(browse_, &QPushButton::clicked, this, [this] {
    const QString dir =
        QFileDialog::getExistingDirectory(this, tr("Checkpoint directory"), checkpoint_->text());
    if (!dir.isEmpty()) {
      checkpoint_->setText(dir);
    }
  });
  connect(companions_browse_, &QPushButton::clicked, this, [this] {
    const QString file =
        QFileDialog::getOpenFileName(this, tr("Companion prompts"), companions_->text());
    if (!file.isEmpty()) {
      companions_->setText(file);
      loadCompanions();
    }
  });
  connect(companions_, &QLineEdit::editingFinished, this, &RunPanel::loadCompanions);
  connect(preset_ops_, &QPushButton::clicked, this, &RunPanel::resetWorkaroundToPreset);
  connect(run_, &QPushButton::clicked, this, &RunPanel::requestRun);
  connect(cancel_, &QPushButton::clicked, this, &RunPanel::cancelRequested);
  connect(workaround_, &QCheckBox::toggled, this, &RunPanel::workaroundToggled);
  // The estimate follows every field that changes the work.
  for (QComboBox* c : {preset_, device_, dtype_, experts_, policy_, mode_}) {
    connect(c, &QComboBox::currentIndexChanged, this, &RunPanel::updateEstimate);
  }
  for (QSpinBox* sb : {repeats_, steps_, max_new_tokens_}) {
    connect(sb, &QSpinBox::valueChanged, this, &RunPanel::updateEstimate);
  }
  connect(batch_sizes_, &QLineEdit::textChanged, this, &RunPanel::updateEstimate);
  connect(checkpoint_, &QLineEdit::textChanged, this, &RunPanel::updateEstimate);
  // The kept prompt ids hold while the prompt, the chat template and the model are theirs.
  connect(prompt_, &QPlainTextEdit::textChanged, this, &RunPanel::updatePromptNote);
  connect(chat_, &QCheckBox::toggled, this, &RunPanel::updatePromptNote);
  connect(preset_, &QComboBox::currentIndexChanged, this, &RunPanel::updatePromptNote);
  connect(checkpoint_, &QLineEdit::textChanged, this, &RunPanel::updatePromptNote);
  connect(workaround_, &QCheckBox::toggled, this, &RunPanel::updateEstimate);
}

QWidget* RunPanel::buildForm() {
  auto* form = new QWidget(this);
  auto* ckpt_row = new QHBoxLayout;
  ckpt_row->addWidget(checkpoint_, 1);
  ckpt_row->addWidget(browse_);
  auto* model_box = new QGroupBox(tr("Model"), form);
  auto* model_form = new QFormLayout(model_box);
  model_form->addRow(tr("Preset"), preset_);
  model_form->addRow(tr("Checkpoint"), ckpt_row);
  auto* device_row = new QHBoxLayout;
  device_row->addWidget(device_, 1);
  device_row->addWidget(targets_button_);
  model_form->addRow(tr("Device"), device_row);
  model_form->addRow(QString(), device_note_);
  model_form->addRow(tr("Precision"), dtype_);
  model_form->addRow(tr("Experts"), experts_);

  auto* run_box = new QGroupBox(tr("Experiment"), form);
  auto* run_form = new QFormLayout(run_box);
  run_form->addRow(tr("Prompt"), prompt_);
  run_form->addRow(QString(), chat_);
  run_form->addRow(QString(), prompt_note_);
  run_form->addRow(tr("Batch sizes"), batch_sizes_);
  run_form->addRow(tr("B=1 repeats"), repeats_);
  run_form->addRow(tr("Steps"), steps_);
  run_form->addRow(tr("New tokens"), max_new_tokens_);
  run_form->addRow(tr("Seed"), seed_);
  run_form->addRow(tr("RNG"), rng_);
  run_form->addRow(tr("Prefill"), prefill_);
  auto* companions_row = new QHBoxLayout;
  companions_row->addWidget(companions_, 1);
  companions_row->addWidget(companions_browse_);
  run_form->addRow(tr("Companions"), companions_row);
  run_form->addRow(QString(), companions_note_);
  run_form->addRow(tr("Row under test"), row_);
  run_form->addRow(tr("Positions"), positions_);
  run_form->addRow(tr("Comparison"), mode_);
  run_form->addRow(tr("Emulation profile"), policy_);
  run_form->addRow(profile_note_);

  auto* wa_box = new QGroupBox(tr("Workaround"), form);
  auto* wa_layout = new QVBoxLayout(wa_box);
  auto* wa_row = new QHBoxLayout;
  wa_row->addWidget(workaround_, 1);
  wa_row->addWidget(strategy_);
  wa_row->addWidget(preset_ops_);
  wa_layout->addLayout(wa_row);
  wa_layout->addWidget(ops_);

  auto* layout = new QVBoxLayout(form);
  layout->addWidget(model_box);
  layout->addWidget(run_box);
  layout->addWidget(wa_box);
  layout->addStretch(1);
  return form;
}

void RunPanel::buildOpList() {
  ops_ = new QTableWidget(ops::kOpFamilyCount, OpColumnCount, this);
  ops_->setObjectName(QStringLiteral("WorkaroundOps"));
  ops_->setHorizontalHeaderLabels({tr("Op family"), tr("First layer"), tr("Last layer")});
  ops_->horizontalHeaderItem(OpFirstColumn)->setToolTip(tr("First layer (inclusive), 0-based"));
  ops_->horizontalHeaderItem(OpLastColumn)
      ->setToolTip(tr("Last layer (inclusive), 0-based; \"last\": through the last layer"));
  ops_->verticalHeader()->hide();
  ops_->horizontalHeader()->setSectionResizeMode(OpFamilyColumn, QHeaderView::Stretch);
  ops_->horizontalHeader()->setSectionResizeMode(OpFirstColumn, QHeaderView::ResizeToContents);
  ops_->horizontalHeader()->setSectionResizeMode(OpLastColumn, QHeaderView::ResizeToContents);
  ops_->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  ops_->setWordWrap(false);
  ops_->setToolTip(
      tr("Families computed row-wise and their layer range (\"last\": through the last layer; "
         "per-step families have no layer range)"));
  for (int f = 0; f < ops::kOpFamilyCount; ++f) {
    const auto family = static_cast<ops::OpFamily>(f);
    auto* item = new QTableWidgetItem(q(ops::family_name(family)));
    item->setFlags(Qt::ItemIsEnabled | Qt::ItemIsUserCheckable);
    item->setCheckState(Qt::Unchecked);
    item->setToolTip(tr("%1 (%2)%3")
                         .arg(q(ops::family_label(family)), q(ops::family_name(family)),
                              ops::family_is_per_layer(family)
                                  ? QString()
                                  : tr(": once per denoising step, no layer range")));
    ops_->setItem(f, OpFamilyColumn, item);
    auto* first = spin(ops_, 0, 1000, 0, tr("first layer (inclusive), 0-based"));
    auto* last = spin(ops_, -1, 1000, -1,
                      tr("last layer (inclusive), 0-based; \"last\" (-1): the last layer"));
    last->setSpecialValueText(tr("last"));
    first->setEnabled(ops::family_is_per_layer(family));
    last->setEnabled(ops::family_is_per_layer(family));
    ops_->setCellWidget(f, OpFirstColumn, first);
    ops_->setCellWidget(f, OpLastColumn, last);
  }
  ops_->resizeColumnsToContents();
  ops_->resizeRowsToContents();
  // Every family in view: the table is as tall as its rows (the form scrolls, the table not).
  int height = ops_->horizontalHeader()->sizeHint().height() + 2 * ops_->frameWidth();
  for (int r = 0; r < ops_->rowCount(); ++r) {
    height += ops_->rowHeight(r);
  }
  ops_->setMinimumHeight(height);
  ops_->setMaximumHeight(height);
  ops_->setVerticalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
}

void RunPanel::updateModelFields() {
  const bool checkpoint = preset_->currentIndex() == preset_->count() - 1;
  checkpoint_->setEnabled(checkpoint);
  browse_->setEnabled(checkpoint);
  const bool cpu = device() == QStringLiteral("cpu");
  // The emulation and fp32 are CPU-only (core refuses them elsewhere); say so in the form.
  if (!cpu) {
    policy_->setCurrentIndex(policy_->findData(QStringLiteral("default")));
    dtype_->setCurrentText(QStringLiteral("bf16"));
  }
  dtype_->setEnabled(cpu);
  policy_->setEnabled(cpu);
  if (deviceAvailable()) {
    device_note_->hide();
  } else {
    device_note_->setText(
        tr("%1%2 is not available on this machine: Run is refused. Choose CPU to run the demo "
           "with the emulation profile of that GPU, or run the experiment there with "
           "batchlens-cli (Run > Copy command for a GPU server).")
            .arg(device(), missing_device_name_.isEmpty()
                               ? QString()
                               : QStringLiteral(" (%1)").arg(missing_device_name_)));
    device_note_->show();
  }
  updateProfileNote();
}

void RunPanel::updateProfileNote() {
  const QString name = policy_->currentData().toString();
  const ops::EmulationProfile* profile = ops::find_emulation_profile(name.toStdString());
  if (profile == nullptr) {
    profile_note_->setText(
        device() == QStringLiteral("cpu")
            ? tr("<b>No emulation</b>: kernels as transformers calls them. CPU GEMMs are batch "
                 "invariant, so B=2,4 are expected to equal B=1 here.")
            : tr("<b>Real kernels</b> of this GPU, as transformers calls them."));
    return;
  }
  profile_note_->setText(tr("<b>EMULATION</b> of the %1 (not a measurement of it): %2. "
                            "<i>Source: %3.</i>")
                             .arg(q(profile->gpu).toHtmlEscaped(),
                                  q(profile->description).toHtmlEscaped(),
                                  q(profile->source).toHtmlEscaped()));
}

QString RunPanel::device() const {
  return device_->currentData().toString();
}

bool RunPanel::deviceAvailable() const {
  return device_->currentIndex() >= 0 && !device_->currentData(kMissingRole).toBool();
}

std::optional<remote::SshTarget> RunPanel::remoteTarget() const {
  const QVariant target = device_->currentData(kTargetRole);
  if (!target.isValid() || target.toInt() < 0 ||
      target.toInt() >= static_cast<int>(targets_.size())) {
    return std::nullopt;
  }
  return targets_[static_cast<std::size_t>(target.toInt())].ssh;
}

bool RunPanel::selectRemoteDevice(int target, const QString& device) {
  for (int i = 0; i < device_->count(); ++i) {
    const QVariant t = device_->itemData(i, kTargetRole);
    if (t.isValid() && t.toInt() == target && device_->itemData(i).toString() == device &&
        !device_->itemData(i, kMissingRole).toBool()) {
      device_->setCurrentIndex(i);
      return true;
    }
  }
  return false;
}

void RunPanel::setRemoteTargets(std::vector<RemoteTarget> targets) {
  // The current choice, kept by (target name, device) when it is still listed.
  const std::optional<remote::SshTarget> was = remoteTarget();
  const QString was_device = device();
  const QSignalBlocker block(device_);
  for (int i = device_->count() - 1; i >= 0; --i) {
    if (device_->itemData(i, kTargetRole).isValid()) {
      device_->removeItem(i);
    }
  }
  targets_ = std::move(targets);
  int keep = -1;
  for (int t = 0; t < static_cast<int>(targets_.size()); ++t) {
    const RemoteTarget& target = targets_[static_cast<std::size_t>(t)];
    if (!target.info) {
      device_->addItem(tr("%1 — not reachable").arg(target.name()), QStringLiteral("cpu"));
      const int index = device_->count() - 1;
      device_->setItemData(index, t, kTargetRole);
      device_->setItemData(index, true, kMissingRole);
      device_->setItemData(index, target.status(), Qt::ToolTipRole);
      continue;
    }
    for (const std::string& d : target.info->devices) {
      // "cuda:0 (NVIDIA H200)" -> data "cuda:0"
      const QString label = q(d);
      const QString id = label.section(QLatin1Char(' '), 0, 0);
      device_->addItem(QStringLiteral("%1: %2").arg(target.name(), label), id);
      const int index = device_->count() - 1;
      device_->setItemData(index, t, kTargetRole);
      device_->setItemData(
          index,
          tr("%1 on the SSH target %2 (%3): the run goes there, its progress and its file come "
             "back")
              .arg(label, target.name(), target.status()),
          Qt::ToolTipRole);
      if (was && was->describe() == target.ssh.describe() && id == was_device) {
        keep = index;
      }
    }
  }
  if (keep >= 0) {
    device_->setCurrentIndex(keep);
  } else if (was || device_->currentIndex() < 0) {
    device_->setCurrentIndex(0);  // the chosen target's device is gone: this machine's CPU
  }
  updateModelFields();
}

void RunPanel::loadCompanions() {
  const QString path = companions_->text().trimmed();
  if (path.startsWith(QLatin1Char('('))) {
    return;  // the shown experiment's companions, kept as they are
  }
  companions_prompts_.clear();
  companions_note_->setStyleSheet(QStringLiteral("color:#444;"));
  if (!path.isEmpty()) {
    auto read = setup::read_prompts(path.toStdString(), "companions file");
    if (read.ok()) {
      companions_prompts_ = std::move(read).value();
    } else {
      companions_note_->setStyleSheet(QStringLiteral("color:#a50026;"));
      companions_note_->setText(q(read.error().message));
      companions_note_->show();
      prefill_->setEnabled(true);
      return;
    }
  }
  updateCompanionFields();
}

void RunPanel::updateCompanionFields() {
  const bool mixed = !companions_prompts_.empty();
  if (mixed) {
    // A batch of different prompts is prefilled at once, as a server does.
    selectText(prefill_, QStringLiteral("batched"));
    companions_note_->setStyleSheet(QStringLiteral("color:#444;"));
    companions_note_->setText(
        tr("%n companion prompt(s), cycled over the other rows; the prefill is batched", nullptr,
           static_cast<int>(companions_prompts_.size())));
  }
  companions_note_->setVisible(mixed);
  prefill_->setEnabled(!mixed);
  positions_->setEnabled(mixed);
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
  if (!deviceAvailable()) {
    return base::Error{base::ErrorCode::DeviceUnavailable,
                       device().toStdString() +
                           " is not available on this machine; choose CPU (the demo with an "
                           "emulation profile) or run it there with batchlens-cli"};
  }
  s.load.device = device().toStdString();
  s.load.dtype = dtype_->currentText().toStdString();
  s.load.experts = experts_->currentText().toStdString();
  s.prompt = prompt_->toPlainText().toStdString();
  s.chat_template = chat_->isChecked();
  s.prompt_ids = keptPromptIds();
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
  s.kernels = true;  // the Kernels tab: one extra decoder pass per engine
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
  s.composition.companions = companions_prompts_;
  s.composition.row = row_->value();
  const auto positions = generation::parse_position_mode(positions_->currentText().toStdString());
  if (!positions.ok()) {
    return positions.error();
  }
  // The positions choose only for a batch of different prompts (the combo is off without).
  s.composition.positions =
      s.composition.mixed() ? positions.value() : generation::PositionMode::Shared;
  auto policy = ops::policy_from_text(policy_->currentData().toString().toStdString());
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
  const QString device =
      QString::fromStdString(s.load.device == "cuda" ? std::string("cuda:0") : s.load.device);
  int index = device_->findData(device);
  if (index < 0) {
    // Not on this machine: shown and flagged, never replaced by the CPU behind the user's back.
    device_->addItem(tr("%1 — not available here").arg(device), device);
    index = device_->count() - 1;
    device_->setItemData(index, true, kMissingRole);
    device_->setItemData(index, tr("This machine has no %1").arg(device), Qt::ToolTipRole);
  }
  device_->setCurrentIndex(index);
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
  companions_prompts_ = s.composition.companions;
  companions_->setText(s.composition.mixed()
                           ? tr("(%n companion(s) of the shown experiment)", nullptr,
                                static_cast<int>(s.composition.companions.size()))
                           : QString());
  row_->setValue(static_cast<int>(s.composition.row));
  selectText(positions_, QString::fromLatin1(generation::name(s.composition.positions)));
  updateCompanionFields();
  const QString policy = q(ops::policy_text(s.policy));
  if (policy_->findData(policy) < 0) {
    // A combination or custom policy: offered as it is.
    policy_->addItem(policy, policy);
    policy_->setItemData(policy_->count() - 1, q(ops::describe(s.policy)), Qt::ToolTipRole);
  }
  policy_->setCurrentIndex(policy_->findData(policy));
  updateModelFields();
  keepPromptIds(s.prompt_ids);
}

void RunPanel::setExperiment(const experiment::ExperimentResult& result) {
  missing_device_name_ = QString::fromStdString(result.provenance.device_name);
  setSpec(result.spec);
  // What ran: the generation config fills what the spec left to the model's defaults.
  const auto ran = generation::parse_generation_config(result.generation_config_json, {});
  if (ran.ok()) {
    if (!result.spec.overrides.max_denoising_steps) {
      steps_->setValue(ran.value().sampler.max_denoising_steps);
    }
    if (!result.spec.overrides.max_new_tokens) {
      max_new_tokens_->setValue(static_cast<int>(
          std::min<std::int64_t>(ran.value().max_new_tokens, max_new_tokens_->maximum())));
    }
  }
  if (!result.spec.prompt_ids.empty() || result.spec.prompt.empty()) {
    // Shown as the model saw it, without a second chat template.
    prompt_->setPlainText(QString::fromStdString(result.prompt_text));
    chat_->setChecked(false);
  }
  updateModelFields();
  // The ids as they ran: decoded text tokenised again need not give them back.
  keepPromptIds(result.prompt_ids.empty() ? result.spec.prompt_ids : result.prompt_ids);
}

QString RunPanel::modelKey() const {
  return preset_->currentIndex() == preset_->count() - 1
             ? QStringLiteral("checkpoint:") + checkpoint_->text().trimmed()
             : QStringLiteral("preset:") + preset_->currentText();
}

void RunPanel::keepPromptIds(std::vector<std::int64_t> ids) {
  kept_prompt_ = {std::move(ids), prompt_->toPlainText(), chat_->isChecked(), modelKey()};
  updatePromptNote();
  updateEstimate();
}

std::vector<std::int64_t> RunPanel::keptPromptIds() const {
  const bool same_form = prompt_->toPlainText() == kept_prompt_.text &&
                         chat_->isChecked() == kept_prompt_.chat_template &&
                         modelKey() == kept_prompt_.model;
  return same_form ? kept_prompt_.ids : std::vector<std::int64_t>{};
}

void RunPanel::updatePromptNote() {
  const std::size_t ids = keptPromptIds().size();
  prompt_note_->setVisible(ids > 0);
  prompt_note_->setText(
      tr("Runs the experiment's %1 prompt token ids as they ran; editing the prompt, the chat "
         "template or the model tokenises the text instead.")
          .arg(ids));
}

namespace {

// The version of a model's files the step facts come from: the checkpoint's config.json and
// generation_config.json by path, size and modification time; a preset by name (no file).
QString stepFactsKey(const model::ModelSource& source) {
  if (source.checkpoint_dir.empty()) {
    return QStringLiteral("preset:") + q(source.preset);
  }
  const QDir dir(QString::fromStdString(source.checkpoint_dir.string()));
  QString key = QStringLiteral("checkpoint:") + dir.path();
  for (const QString& name :
       {QStringLiteral("config.json"), QStringLiteral("generation_config.json")}) {
    const QFileInfo file(dir.filePath(name));
    key += file.exists() ? QStringLiteral("|%1:%2:%3")
                               .arg(name)
                               .arg(file.size())
                               .arg(file.lastModified().toMSecsSinceEpoch())
                         : QStringLiteral("|%1:none").arg(name);
  }
  return key;
}

}  // namespace

base::Result<experiment::StepCount> RunPanel::stepsOf(const experiment::ExperimentSpec& s) const {
  const QString key = stepFactsKey(s.model);
  if (!step_facts_ || key != step_facts_key_) {
    step_facts_ = experiment::read_step_facts(s.model);
    step_facts_key_ = key;
    ++model_file_reads_;
  }
  if (!step_facts_->ok()) {
    return step_facts_->error();
  }
  return experiment::count_steps(s, step_facts_->value());
}

double RunPanel::expectedSeconds() const {
  const auto s = spec();
  if (!s.ok()) {
    return -1;
  }
  const auto steps = stepsOf(s.value());
  if (!steps.ok()) {
    return -1;
  }
  const StepCost cost = stepCost(s.value());
  if (cost.seconds_per_step <= 0) {
    return -1;
  }
  return expectedTotal(s.value(), cost, steps.value().engine_steps);
}

QString RunPanel::expectedText() const {
  const auto s = spec();
  if (!s.ok()) {
    return tr("Expected duration: — (%1)").arg(QString::fromStdString(s.error().message));
  }
  if (const auto target = remoteTarget()) {
    // This machine's measurements say nothing of the server's speed.
    return tr("Expected duration: measured on %1 (runs there over SSH; progress and ETA come "
              "from it, the file comes back here)")
        .arg(q(target->describe()));
  }
  const auto steps = stepsOf(s.value());
  if (!steps.ok()) {
    return tr("Expected duration: unknown (%1)").arg(QString::fromStdString(steps.error().message));
  }
  const StepCost cost = stepCost(s.value());
  const experiment::StepCount& n = steps.value();
  const QString work =
      tr("%1 runs × %2 canvas(es) × ≤ %3 steps = %4 decoder passes")
          .arg(n.engine_steps / std::max<std::int64_t>(n.canvases * n.steps_per_canvas, 1))
          .arg(n.canvases)
          .arg(n.steps_per_canvas)
          .arg(n.engine_steps);
  if (cost.seconds_per_step <= 0) {
    return tr("Expected duration: not measured yet for this model here (%1); a first run "
              "measures it.")
        .arg(work);
  }
  const double total = expectedTotal(s.value(), cost, n.engine_steps);
  const double fixed = total - static_cast<double>(n.engine_steps) * cost.seconds_per_step;
  return tr("Expected: <b>about %1</b> (%2, %3 ms each, plus %4 s to build the model%5; %6)")
      .arg(total < 90 ? tr("%1 s").arg(std::max(1.0, std::round(total))) : formatDuration(total),
           work)
      .arg(cost.seconds_per_step * 1000.0, 0, 'f', 0)
      .arg(fixed, 0, 'f', 1)
      .arg(s.value().kernels ? tr(" and record its kernels") : QString())
      .arg(cost.measured ? tr("as measured on this machine") : tr("calibrated on a 2-core CPU"));
}

void RunPanel::recordMeasuredCost(const experiment::ExperimentResult& result) {
  const auto& t = result.timings;
  const experiment::StepCount steps = experiment::steps_taken(result);
  if (t.engines_s <= 0 || steps.engine_steps <= 0) {
    return;
  }
  const double per_step =
      (t.engines_s + t.comparisons_s + t.results_s) / static_cast<double>(steps.engine_steps);
  QSettings().setValue(
      costKey(result.spec),
      QStringList{QString::number(per_step), QString::number(t.load_s),
                  QString::number(result.spec.kernels ? t.kernels_s : kCalibratedKernelsSeconds)});
}

void RunPanel::updateEstimate() {
  expected_->setText(expectedText());
}

ops::Strategy RunPanel::workaroundStrategy() const {
  return static_cast<ops::Strategy>(strategy_->currentData().toInt());
}

ops::OpPolicy RunPanel::workaroundPolicy() const {
  const ops::Strategy strategy = workaroundStrategy();
  ops::OpPolicy custom;
  custom.name = strategy == ops::Strategy::RowWise ? "custom_row_wise" : "custom_batch_invariant";
  ops::FamilySet everywhere;  // families checked for every layer
  for (int f = 0; f < ops::kOpFamilyCount; ++f) {
    if (ops_->item(f, OpFamilyColumn)->checkState() != Qt::Checked) {
      continue;
    }
    const int first = qobject_cast<QSpinBox*>(ops_->cellWidget(f, OpFirstColumn))->value();
    const int last = qobject_cast<QSpinBox*>(ops_->cellWidget(f, OpLastColumn))->value();
    ops::FamilySet family;
    family.set(static_cast<std::size_t>(f));
    custom.rules.push_back({family, first, last, strategy});
    if (first == 0 && last == -1) {
      everywhere |= family;
    }
  }
  ops::OpPolicy preset = ops::OpPolicy::issue_workaround();
  const bool whole = everywhere.count() == custom.rules.size();
  if (strategy == ops::Strategy::RowWise && whole &&
      ops::OpPolicy::row_wise(everywhere, preset.name) == preset) {
    return preset;
  }
  return custom;
}

bool RunPanel::workaroundEnabled() const {
  return workaround_->isChecked();
}

void RunPanel::setWorkaroundEnabled(bool on) {
  {
    const QSignalBlocker block(workaround_);
    workaround_->setChecked(on);
  }
  updateEstimate();  // the next Run includes (or not) the workaround's runs
}

void RunPanel::resetWorkaroundToPreset() {
  showWorkaroundPolicy(ops::OpPolicy::issue_workaround());
}

void RunPanel::showWorkaroundPolicy(const ops::OpPolicy& policy) {
  for (int f = 0; f < ops::kOpFamilyCount; ++f) {
    setWorkaroundFamily(ops_->item(f, OpFamilyColumn)->text(), false);
  }
  for (const ops::PolicyRule& rule : policy.rules) {
    if (rule.strategy == ops::Strategy::Batched) {
      continue;
    }
    strategy_->setCurrentIndex(strategy_->findData(static_cast<int>(rule.strategy)));
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
  // Every run starts and ends on an empty bar: no old fill under "idle".
  progress_->setRange(0, 1000);
  progress_->setValue(0);
  progress_->setFormat(running ? tr("starting…") : tr("idle"));
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

QString RunPanel::message() const {
  return status_->text();
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
  const auto target = remoteTarget();
  settings.setValue(QStringLiteral("deviceTarget"), target ? q(target->describe()) : QString());
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
  settings.setValue(QStringLiteral("policy"), policy_->currentData());
  settings.setValue(QStringLiteral("version"), kSettingsVersion);
  settings.setValue(QStringLiteral("workaroundOps"), q(ops::policy_text(workaroundPolicy())));
  settings.endGroup();
}

void RunPanel::restoreSettings(const QSettings& settings) {
  const auto value = [&settings](const char* key) {
    return settings.value(QStringLiteral("run/") + QLatin1String(key));
  };
  // Settings of an older panel (before the one-click demo's defaults) are not restored.
  if (!value("preset").isValid() || value("version").toInt() != kSettingsVersion) {
    return;
  }
  selectText(preset_, value("preset").toString());
  checkpoint_->setText(value("checkpoint").toString());
  const int device = device_->findData(value("device"));
  device_->setCurrentIndex(device >= 0 ? device : 0);
  // A device of an SSH target (setRemoteTargets ran first, from the same settings).
  const QString target = value("deviceTarget").toString();
  for (int t = 0; !target.isEmpty() && t < static_cast<int>(targets_.size()); ++t) {
    if (targets_[static_cast<std::size_t>(t)].name() == target) {
      selectRemoteDevice(t, value("device").toString());
    }
  }
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
  const int policy = policy_->findData(value("policy").toString());
  if (policy >= 0) {
    policy_->setCurrentIndex(policy);
  }
  // The op list as saved (the preset's name or policy JSON); the preset when unreadable.
  const auto saved = ops::policy_from_text(value("workaroundOps").toString().toStdString());
  showWorkaroundPolicy(saved.ok() ? saved.value() : ops::OpPolicy::issue_workaround());
  updateModelFields();
  keepPromptIds({});  // the saved prompt is text
}

}  // namespace batchlens::ui
