// SPDX-License-Identifier: Apache-2.0
// Kernels: the experiment's kernel provenance (core/experiment/kernels.h) as a table per engine,
// rows that differ from the B=1 reference marked, and the kernels at the first divergence.
#include <QCheckBox>
#include <QColor>
#include <QComboBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QTableWidget>
#include <QVBoxLayout>

#include "core/analysis/kernel_evidence.h"
#include "core/experiment/kernel_provenance.h"
#include "ui/views.h"

namespace batchlens::ui {

namespace {

constexpr QRgb kDiffers = 0xfcd5ce;

}  // namespace

KernelsView::KernelsView(ExplorerState* state, QWidget* parent) : CoalescedView(state, parent) {
  caption_ = new QLabel(this);
  caption_->setWordWrap(true);
  first_ = new QLabel(this);
  first_->setObjectName(QStringLiteral("KernelsAtFirstDivergence"));
  first_->setWordWrap(true);
  first_->setTextFormat(Qt::RichText);
  first_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  first_->setMargin(6);
  first_->setStyleSheet(QStringLiteral("background:#f7f3e8;"));
  engine_ = new QComboBox(this);
  engine_->setObjectName(QStringLiteral("KernelsEngine"));
  engine_->setToolTip(
      tr("Whose decoder pass the table shows; each row is compared with the "
         "same op in the B=1 reference's pass"));
  sc_ = new QCheckBox(tr("with self-conditioning"), this);
  sc_->setChecked(true);
  sc_->setToolTip(
      tr("Steps after a canvas's first run the self-conditioning matmul and MLP; "
         "the first step does not"));
  table_ = new QTableWidget(this);
  table_->setObjectName(QStringLiteral("KernelsTable"));
  table_->setColumnCount(7);
  table_->setHorizontalHeaderLabels({tr("Op family"), tr("Layer"), tr("Op"), tr("M × N × K"),
                                     tr("Calls"), tr("What ran"), tr("Against B=1")});
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->verticalHeader()->hide();
  table_->horizontalHeader()->setStretchLastSection(true);
  auto* row = new QHBoxLayout;
  row->addWidget(new QLabel(tr("Engine:"), this));
  row->addWidget(engine_);
  row->addWidget(sc_);
  row->addStretch(1);
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(caption_);
  layout->addWidget(first_);
  layout->addLayout(row);
  layout->addWidget(table_, 1);
  connect(engine_, &QComboBox::currentIndexChanged, this, [this] {
    if (!filling_) {
      fillTable();
    }
  });
  connect(sc_, &QCheckBox::toggled, this, [this] { fillTable(); });
}

void KernelsView::refresh() {
  const experiment::ExperimentResult* r = state_->result();
  const experiment::ComparisonResult* c = state_->comparison();
  filling_ = true;
  const QString keep = engine_->currentData().toString();
  engine_->clear();
  if (r == nullptr || !r->kernels) {
    caption_->setText(r == nullptr
                          ? tr("No experiment shown.")
                          : tr("This experiment has no kernel provenance: it was run with "
                               "--no-kernels or by a BatchLens before schema 1.5. Run it again to "
                               "record which kernels each op family launched."));
    first_->hide();
    table_->setRowCount(0);
    differing_ = 0;
    filling_ = false;
    return;
  }
  caption_->setText(tr("Kernel provenance: %1 (recorded in %2 s).")
                        .arg(QString::fromStdString(r->kernels->source))
                        .arg(r->kernels->wall_s, 0, 'f', 1));
  for (const experiment::EngineKernels& e : r->kernels->engines) {
    const QString id = QString::fromStdString(e.run);
    if (e.self_conditioning && engine_->findData(id) < 0) {
      engine_->addItem(QStringLiteral("%1 (B=%2, %3)")
                           .arg(id)
                           .arg(e.batch_size)
                           .arg(QString::fromStdString(e.policy)),
                       id);
    }
  }
  // The selected comparison's run by default; the user's choice while the document stays.
  int index = engine_->findData(keep);
  const QString comparison = c != nullptr ? QString::fromStdString(c->id) : QString();
  if (c != nullptr && (index < 0 || comparison != last_comparison_)) {
    index = engine_->findData(QString::fromStdString(c->run));
  }
  last_comparison_ = comparison;
  engine_->setCurrentIndex(std::max(index, 0));
  filling_ = false;

  const std::vector<std::string> lines =
      c != nullptr ? analysis::first_divergence_kernels(*r, *c) : std::vector<std::string>{};
  first_->setVisible(!lines.empty());
  QString html = tr("<b>Kernels at the first divergence</b> (%1):")
                     .arg(QString::fromStdString(c != nullptr ? c->id : ""));
  for (const std::string& line : lines) {
    const QString text = QString::fromStdString(line).toHtmlEscaped();
    html +=
        QStringLiteral("<br>") + (text.contains(QStringLiteral(" differs: "))
                                      ? QStringLiteral("<b style='color:#a4161a'>%1</b>").arg(text)
                                      : text);
  }
  first_->setText(html);
  fillTable();
}

void KernelsView::fillTable() {
  const experiment::ExperimentResult* r = state_->result();
  table_->setRowCount(0);
  differing_ = 0;
  if (r == nullptr || !r->kernels) {
    return;
  }
  const std::string run = engine_->currentData().toString().toStdString();
  const bool sc = sc_->isChecked();
  const experiment::EngineKernels* e = r->kernels->engine(run, sc);
  const experiment::EngineKernels* ref = r->kernels->engine(experiment::reference_run_of(run), sc);
  if (e == nullptr) {
    return;
  }
  table_->setRowCount(static_cast<int>(e->ops.size()));
  for (int i = 0; i < static_cast<int>(e->ops.size()); ++i) {
    const experiment::OpKernels& op = e->ops[static_cast<std::size_t>(i)];
    const experiment::OpKernels* base =
        ref != nullptr && ref != e ? experiment::find_op(*ref, op.family, op.layer) : nullptr;
    const std::vector<std::string> diff =
        base != nullptr ? experiment::kernel_differences(*base, op) : std::vector<std::string>{};
    QString against = ref == e ? tr("(the reference)") : tr("same");
    if (ref != e && base == nullptr) {
      against = tr("not in the reference's pass");
    }
    if (!diff.empty()) {
      QStringList parts;
      for (const std::string& d : diff) {
        parts << QString::fromStdString(d);
      }
      against = parts.join(QStringLiteral("; "));
      ++differing_;
    }
    const QStringList cells{QString::fromStdString(op.family),
                            op.layer < 0 ? QStringLiteral("–") : QString::number(op.layer),
                            QString::fromStdString(op.op) + QStringLiteral(" (") +
                                QString::fromStdString(op.strategy) + QStringLiteral(")"),
                            QStringLiteral("%1 × %2 × %3").arg(op.m).arg(op.n).arg(op.k),
                            QString::number(op.calls),
                            QString::fromStdString(experiment::describe(op)),
                            against};
    for (int col = 0; col < cells.size(); ++col) {
      auto* item = new QTableWidgetItem(cells[col]);
      item->setToolTip(col == 6 && base != nullptr
                           ? tr("B=1: %1\nhere: %2")
                                 .arg(QString::fromStdString(experiment::describe(*base)),
                                      QString::fromStdString(experiment::describe(op)))
                           : cells[col]);
      if (!diff.empty()) {
        item->setBackground(QColor::fromRgb(kDiffers));
      }
      table_->setItem(i, col, item);
    }
  }
  table_->resizeColumnsToContents();
}

QPixmap KernelsView::renderReport(const QSize& size) {
  flush();
  const QSize old = this->size();
  resize(size);
  QPixmap page = grab();
  resize(old);
  return page;
}

}  // namespace batchlens::ui
