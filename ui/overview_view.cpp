// SPDX-License-Identifier: Apache-2.0
// Overview: the verdict of every comparison, provenance and the runs.
#include <QBrush>
#include <QColor>
#include <QHeaderView>
#include <QItemSelectionModel>
#include <QLabel>
#include <QSplitter>
#include <QTableView>
#include <QTextBrowser>
#include <QVBoxLayout>

#include "ui/comparison_table_model.h"
#include "ui/report_render.h"
#include "ui/views.h"

namespace batchlens::ui {

namespace {

QString q(const std::string& s) {
  return QString::fromStdString(s);
}

QString percent(double share) {
  return QStringLiteral("%1 %").arg(100.0 * share, 0, 'g', 4);
}

QString escaped(const std::string& s) {
  return q(s).toHtmlEscaped();
}

QString provenanceBanner(const experiment::ExperimentResult& r) {
  const auto& p = r.provenance;
  if (p.emulated) {
    return QObject::tr(
        "EMULATED: some runs used the emulated split-K kernel, a CPU emulation of GPU libraries "
        "that choose the reduction split by batch shape. Not a GPU measurement.");
  }
  if (p.device.rfind("cuda", 0) == 0) {
    return QObject::tr("Recorded on a GPU: %1 (%2), LibTorch %3, not emulated.")
        .arg(q(p.device_name), q(p.device), q(p.libtorch));
  }
  if (p.dtype == "fp32") {
    return QObject::tr("Real CPU kernels in fp32 (not emulated) on %1.").arg(q(p.device_name));
  }
  return QObject::tr("Real CPU kernels (not emulated) on %1.").arg(q(p.device_name));
}

}  // namespace

ComparisonTableModel::ComparisonTableModel(QObject* parent) : QAbstractTableModel(parent) {}

void ComparisonTableModel::setResult(std::shared_ptr<const experiment::ExperimentResult> result) {
  beginResetModel();
  result_ = std::move(result);
  endResetModel();
}

int ComparisonTableModel::rowOf(const QString& id) const {
  if (!result_) {
    return -1;
  }
  for (std::size_t i = 0; i < result_->comparisons.size(); ++i) {
    if (q(result_->comparisons[i].id) == id) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

int ComparisonTableModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() || !result_ ? 0 : static_cast<int>(result_->comparisons.size());
}

int ComparisonTableModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : ColumnCount;
}

QVariant ComparisonTableModel::headerData(int section, Qt::Orientation orientation,
                                          int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) {
    return {};
  }
  switch (section) {
    case Comparison:
      return tr("Comparison");
    case Text:
      return tr("Text");
    case TokensChanged:
      return tr("Tokens changed");
    case Stop:
      return tr("Stop");
    case Steps:
      return tr("Steps");
    case FirstDivergence:
      return tr("First divergence");
    case PositionsDiffering:
      return tr("Positions differing (last step)");
    case ScoresDiffering:
      return tr("Token scores differing (last step)");
    default:
      return {};
  }
}

QVariant ComparisonTableModel::data(const QModelIndex& index, int role) const {
  if (!result_ || !index.isValid() || index.row() >= rowCount()) {
    return {};
  }
  const auto& c = result_->comparisons[static_cast<std::size_t>(index.row())];
  if (role == kIdRole) {
    return q(c.id);
  }
  const bool rows = c.kind == "rows";
  if (role == Qt::BackgroundRole) {
    if (index.column() == Text && !rows) {
      return QBrush(c.tokens_identical ? QColor(0xd9, 0xf0, 0xd3) : QColor(0xfc, 0xd5, 0xce));
    }
    if (index.column() == FirstDivergence) {
      return QBrush(c.first.found() ? QColor(0xfc, 0xd5, 0xce) : QColor(0xd9, 0xf0, 0xd3));
    }
    return {};
  }
  if (role != Qt::DisplayRole && role != Qt::ToolTipRole) {
    return {};
  }
  const auto last = experiment::last_step_logit_diff(*result_, c);
  switch (index.column()) {
    case Comparison:
      return role == Qt::ToolTipRole ? q(c.id) : comparisonLabel(*result_, c);
    case Text:
      return rows ? QVariant(tr("—"))
                  : QVariant(c.tokens_identical ? tr("identical") : tr("DIFFERS"));
    case TokensChanged:
      return rows ? QVariant() : QVariant(static_cast<qlonglong>(c.tokens_changed));
    case Stop:
      return rows ? QVariant() : QVariant(c.stop_changed ? tr("CHANGED") : tr("unchanged"));
    case Steps:
      return rows ? QVariant() : QVariant(c.steps_changed ? tr("CHANGED") : tr("unchanged"));
    case FirstDivergence:
      return q(experiment::describe(c.first));
    case PositionsDiffering:
      return rows ? QVariant() : QVariant(percent(last.positions));
    case ScoresDiffering:
      return rows ? QVariant() : QVariant(percent(last.scores));
    default:
      return {};
  }
}

OverviewView::OverviewView(ExplorerState* state, QWidget* parent) : CoalescedView(state, parent) {
  banner_ = new QLabel(this);
  banner_->setObjectName(QStringLiteral("ProvenanceBanner"));
  banner_->setWordWrap(true);
  banner_->setMargin(6);
  model_ = new ComparisonTableModel(this);
  table_ = new QTableView(this);
  table_->setObjectName(QStringLiteral("ComparisonTable"));
  table_->setModel(model_);
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->setSelectionMode(QAbstractItemView::SingleSelection);
  table_->verticalHeader()->hide();
  table_->horizontalHeader()->setStretchLastSection(true);
  table_->setWordWrap(false);
  details_ = new QTextBrowser(this);
  details_->setObjectName(QStringLiteral("OverviewDetails"));

  auto* split = new QSplitter(Qt::Vertical, this);
  split->addWidget(table_);
  split->addWidget(details_);
  split->setStretchFactor(0, 1);
  split->setStretchFactor(1, 2);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->addWidget(banner_);
  layout->addWidget(split, 1);

  connect(table_->selectionModel(), &QItemSelectionModel::currentRowChanged, this,
          [this](const QModelIndex& current) {
            if (current.isValid()) {
              state_->setComparison(current.data(ComparisonTableModel::kIdRole).toString());
            }
          });
  connect(state_, &ExplorerState::documentChanged, this,
          [this] { model_->setResult(state_->document().result); });
}

void OverviewView::refresh() {
  const auto* r = state_->result();
  if (r == nullptr) {
    banner_->clear();
    details_->clear();
    return;
  }
  const bool emulated = r->provenance.emulated;
  banner_->setText(provenanceBanner(*r));
  banner_->setStyleSheet(
      emulated ? QStringLiteral("background:#fff3b0; color:#7a4b00; font-weight:bold;")
               : QStringLiteral("background:#e3f2e1; color:#1d4d1a;"));
  const int row = model_->rowOf(state_->comparisonId());
  if (row >= 0 && table_->currentIndex().row() != row) {
    table_->setCurrentIndex(model_->index(row, 0));
  }
  table_->resizeColumnsToContents();
  details_->setHtml(detailsHtml());
}

QString OverviewView::detailsHtml() const {
  const auto* r = state_->result();
  if (r == nullptr) {
    return {};
  }
  const auto& p = r->provenance;
  QString html;
  html += QStringLiteral("<p><b>%1</b></p>").arg(provenanceBanner(*r).toHtmlEscaped());
  if (const auto* floor = r->comparison("ref__repeat1")) {
    html += floor->first.found()
                ? tr("<p style='color:#b00'><b>Noise floor NOT clean:</b> the B=1 repeat already "
                     "differs (%1); the engine is not deterministic here.</p>")
                      .arg(escaped(experiment::describe(floor->first)))
                : tr("<p><b>Noise floor clean:</b> the B=1 repeat is bitwise identical to the "
                     "reference at every step.</p>");
  }
  html += QStringLiteral("<table cellspacing='3'>");
  const auto row = [&html](const QString& key, const QString& value) {
    html += QStringLiteral("<tr><td><b>%1</b></td><td>%2</td></tr>")
                .arg(key.toHtmlEscaped(), value.toHtmlEscaped());
  };
  row(tr("Source"), state_->document().origin);
  row(tr("Model"), q(r->spec.model.describe()));
  row(tr("Device"), QStringLiteral("%1 (%2)").arg(q(p.device), q(p.device_name)));
  if (!p.driver.empty() || !p.cuda.empty()) {
    row(tr("GPU software"), tr("driver %1, CUDA %2, cuBLAS %3")
                                .arg(q(p.driver), q(p.cuda), q(p.cublas.empty() ? "?" : p.cublas)));
  }
  row(tr("LibTorch"), QStringLiteral("%1 (%2)").arg(q(p.libtorch), q(p.blas)));
  row(tr("Precision"),
      tr("%1, experts %2, %3 threads").arg(q(p.dtype), q(r->spec.load.experts)).arg(p.threads));
  row(tr("Policy"),
      q(ops::policy_text(r->spec.policy)) + (p.emulated ? tr(" (EMULATED split-K)") : QString()));
  row(tr("Workaround"), r->spec.workaround ? q(ops::policy_text(*r->spec.workaround)) : tr("none"));
  if (const std::string switches = r->spec.load.switches.describe(); !switches.empty()) {
    row(tr("Switches"), q(switches));
  }
  row(tr("Sampling"), tr("mode %1, rng %2, prefill %3, seed %4")
                          .arg(QString::fromLatin1(experiment::name(r->spec.mode)),
                               QString::fromLatin1(generation::name(r->spec.rng)),
                               QString::fromLatin1(generation::name(r->spec.prefill)))
                          .arg(r->spec.seed));
  row(tr("Shape"), tr("%1 layers, canvas %2, top-k %3, %4 taps")
                       .arg(r->layers)
                       .arg(r->canvas_length)
                       .arg(r->top_k)
                       .arg(r->taps.size()));
  row(tr("Recorded"),
      tr("%1 on %2 with BatchLens %3").arg(q(p.created_utc), q(p.host), q(p.tool_version)));
  html += QStringLiteral("</table><h4>%1</h4>").arg(tr("Runs"));
  html += QStringLiteral(
      "<table border='1' cellspacing='0' cellpadding='3'><tr><th>run</th><th>B</th>"
      "<th>policy</th><th>stop</th><th>steps per canvas</th><th>wall s</th></tr>");
  for (const auto& run : r->runs) {
    QStringList steps;
    for (int s : run.steps) {
      steps << QString::number(s);
    }
    html += QStringLiteral(
                "<tr><td>%1</td><td>%2</td><td>%3</td><td>%4</td><td>%5</td>"
                "<td>%6</td></tr>")
                .arg(escaped(run.id))
                .arg(run.batch_size)
                .arg(escaped(run.policy_text))
                .arg(run.stop_position)
                .arg(steps.join(QStringLiteral(" ")))
                .arg(run.wall_time_s, 0, 'f', 2);
  }
  html +=
      QStringLiteral("</table><h4>%1</h4><p>%2</p>")
          .arg(
              tr("Prompt"),
              q(r->prompt_text).toHtmlEscaped().replace(QLatin1Char('\n'), QStringLiteral("<br>")));
  return html;
}

QPixmap OverviewView::renderReport(const QSize& size) {
  flush();
  const auto* r = state_->result();
  QString table;
  if (r != nullptr) {
    table += QStringLiteral("<table border='1' cellspacing='0' cellpadding='3'><tr>");
    for (int c = 0; c < ComparisonTableModel::ColumnCount; ++c) {
      table += QStringLiteral("<th>%1</th>")
                   .arg(model_->headerData(c, Qt::Horizontal).toString().toHtmlEscaped());
    }
    table += QStringLiteral("</tr>");
    for (int row = 0; row < model_->rowCount(); ++row) {
      table += QStringLiteral("<tr>");
      for (int c = 0; c < ComparisonTableModel::ColumnCount; ++c) {
        table += QStringLiteral("<td>%1</td>")
                     .arg(model_->index(row, c).data().toString().toHtmlEscaped());
      }
      table += QStringLiteral("</tr>");
    }
    table += QStringLiteral("</table>");
  }
  return composeDocuments(size, tr("Overview"), {tr("Comparisons"), tr("Provenance and runs")},
                          {table, detailsHtml()});
}

}  // namespace batchlens::ui
