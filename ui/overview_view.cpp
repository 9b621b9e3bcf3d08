// SPDX-License-Identifier: Apache-2.0
// Overview: the verdict of every comparison, provenance and the runs.
#include <algorithm>
#include <cmath>

#include <QBrush>
#include <QColor>
#include <QFontMetrics>
#include <QHeaderView>
#include <QItemSelectionModel>
#include <QLabel>
#include <QResizeEvent>
#include <QSplitter>
#include <QTableView>
#include <QTextBrowser>
#include <QVBoxLayout>

#include "core/analysis/culprit.h"
#include "core/analysis/kernel_evidence.h"
#include "core/analysis/story.h"
#include "core/experiment/exact_reference.h"
#include "core/experiment/kernel_provenance.h"
#include "ui/comparison_table_model.h"
#include "ui/qcp.h"
#include "ui/qt_text.h"
#include "ui/report_render.h"
#include "ui/views.h"

namespace batchlens::ui {

namespace {

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
  if (orientation != Qt::Horizontal || (role != Qt::DisplayRole && role != Qt::ToolTipRole)) {
    return {};
  }
  const bool tip = role == Qt::ToolTipRole;
  switch (section) {
    case Comparison:
      return tip ? tr("Which runs are compared: row 0 of a run against the B=1 reference's row "
                      "0, or a batch's rows 1.. against its own row 0")
                 : tr("Comparison");
    case Text:
      return tip ? tr("Whether row 0's final text is identical to the reference's") : tr("Text");
    case TokensChanged:
      return tip ? tr("Generated tokens of row 0 that differ from the reference's, of all "
                      "generated tokens")
                 : tr("Tokens changed");
    case Stop:
      return tip ? tr("Whether the position where row 0 stops (its end-of-sequence token) moved")
                 : tr("Stop");
    case Steps:
      return tip ? tr("Whether the number of denoising steps per canvas changed") : tr("Steps");
    case FirstDivergence:
      return tip ? tr("The first canvas · step, layer, tap and position where any bit of row 0 "
                      "differs (canvases and steps counted from 1, layers and positions from 0)")
                 : tr("First divergence");
    case PositionsDiffering:
      return tip ? tr("At the last compared step: the share of canvas positions whose token "
                      "scores (logits) differ in any bit. Numeric differences, not changed "
                      "tokens: see the headline's last line")
                 : tr("Positions differ (last step)");
    case ScoresDiffering:
      return tip ? tr("At the last compared step: the share of all token-score elements "
                      "(positions × vocabulary) whose bits differ")
                 : tr("Scores differ (last step)");
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
  const bool rows = c.kind == experiment::ComparisonKind::Rows;
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
    case TokensChanged: {
      if (rows) {
        return {};
      }
      const auto* ref = result_->run(c.reference);
      const auto* run = result_->run(c.run);
      const qlonglong total =
          ref != nullptr && run != nullptr
              ? static_cast<qlonglong>(std::max(ref->tokens.size(), run->tokens.size()))
              : 0;
      return tr("%1 of %2").arg(c.tokens_changed).arg(total);
    }
    case Stop:
      return rows ? QVariant() : QVariant(c.stop_changed ? tr("CHANGED") : tr("unchanged"));
    case Steps:
      return rows ? QVariant() : QVariant(c.steps_changed ? tr("CHANGED") : tr("unchanged"));
    case FirstDivergence: {
      QString text = q(experiment::describe(c.first));
      const experiment::ExactAtDivergence* e =
          role == Qt::ToolTipRole && result_->exact ? result_->exact->find(c.id) : nullptr;
      if (e != nullptr) {
        for (const std::string& line : experiment::exact_lines(*e)) {
          text += QStringLiteral("\nexact (fp64): ") + q(line);
        }
      }
      return text;
    }
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
  table_->horizontalHeader()->setStretchLastSection(false);
  table_->setHorizontalScrollBarPolicy(Qt::ScrollBarAsNeeded);
  table_->setWordWrap(false);
  details_ = new QTextBrowser(this);
  details_->setObjectName(QStringLiteral("OverviewDetails"));
  headline_ = new QLabel(this);
  headline_->setObjectName(QStringLiteral("Headline"));
  headline_->setWordWrap(true);
  headline_->setMargin(6);
  headline_->setTextFormat(Qt::RichText);
  headline_->setTextInteractionFlags(Qt::TextBrowserInteraction);
  headline_->setStyleSheet(QStringLiteral("font-size: 12pt;"));
  headline_->setToolTip(tr("Each part links to the view that shows it"));
  why_ = new QLabel(this);
  why_->setObjectName(QStringLiteral("HeadlineWhy"));
  why_->setWordWrap(true);
  why_->setMargin(6);
  why_->setStyleSheet(QStringLiteral("color:#444;"));
  culprit_ = new QLabel(this);
  culprit_->setObjectName(QStringLiteral("Culprit"));
  culprit_->setWordWrap(true);
  culprit_->setMargin(6);
  culprit_->setTextFormat(Qt::RichText);
  culprit_->setTextInteractionFlags(Qt::TextBrowserInteraction);
  culprit_->setStyleSheet(QStringLiteral("background:#eef4fb; color:#123d73;"));
  culprit_->hide();
  kernels_ = new QLabel(this);
  kernels_->setObjectName(QStringLiteral("OverviewKernels"));
  kernels_->setWordWrap(true);
  kernels_->setMargin(6);
  kernels_->setTextFormat(Qt::RichText);
  kernels_->setTextInteractionFlags(Qt::TextBrowserInteraction);
  kernels_->setStyleSheet(QStringLiteral("background:#f7f3e8;"));
  kernels_->setToolTip(
      tr("Which kernels the op behind the first divergence launched at B=1 and "
         "at this batch size (the experiment's kernel provenance)"));
  kernels_->hide();
  exact_ = new QLabel(this);
  exact_->setObjectName(QStringLiteral("OverviewExact"));
  exact_->setWordWrap(true);
  exact_->setMargin(6);
  exact_->setTextFormat(Qt::RichText);
  exact_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  exact_->setStyleSheet(QStringLiteral("background:#eef3f8;"));
  exact_->setToolTip(
      tr("Which one is wrong? The op behind the first divergence and the step's logits, each "
         "computed alone at B=1 and at the batch size from B=1's operands and compared with the "
         "same op in fp64 on the CPU: ULPs in the result's dtype from exact, and the share of "
         "elements where each result is closer. Usually neither is wrong: both round the same "
         "exact value differently."));
  exact_->hide();
  growth_ = new QCustomPlot(this);
  growth_->setObjectName(QStringLiteral("GrowthPlot"));
  growth_->setMinimumHeight(170);
  growth_->yAxis->setScaleType(QCPAxis::stLogarithmic);
  growth_->yAxis->setTicker(QSharedPointer<QCPAxisTickerLog>::create());
  growth_->yAxis->setLabel(tr("share differing (log; bottom edge: 0)"));
  growth_->xAxis->setLabel(tr("denoising step (canvas 1 unless marked)"));
  growth_->legend->setVisible(true);
  growth_->legend->setFont(QFont(font().family(), 8));
  growth_->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
  growth_->axisRect()->setRangeDrag(Qt::Horizontal);
  growth_->axisRect()->setRangeZoom(Qt::Horizontal);
  growth_->setToolTip(
      tr("How the difference grows: for each comparison, the share of canvas positions where "
         "any tapped tensor differs (solid) and the largest share of differing elements over "
         "the taps and layers (dashed, selected comparison). Log scale; steps where nothing "
         "differs sit on the bottom edge, so a curve leaves it at its first divergence."));
  // The legend goes below the plot, never over the data.
  growth_->plotLayout()->addElement(1, 0, growth_->legend);
  // No frame: the legend spans the plot's width and a frame's right and bottom lines fell on
  // the pixel past the plot's edge (clipped in the window and in figure.png).
  growth_->legend->setBorderPen(Qt::NoPen);
  growth_->legend->setMargins(QMargins(6, 2, 6, 4));
  growth_->legend->setFillOrder(QCPLegend::foColumnsFirst);
  growth_->legend->setWrap(4);
  growth_->installEventFilter(this);
  growth_->plotLayout()->setRowStretchFactor(1, 0.001);

  auto* split = new QSplitter(Qt::Vertical, this);
  split->addWidget(growth_);
  split->addWidget(table_);
  split->addWidget(details_);
  split->setStretchFactor(0, 2);
  split->setStretchFactor(1, 2);
  split->setStretchFactor(2, 3);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->addWidget(banner_);
  layout->addWidget(headline_);
  layout->addWidget(why_);
  layout->addWidget(culprit_);
  layout->addWidget(kernels_);
  layout->addWidget(exact_);
  layout->addWidget(split, 1);

  connect(headline_, &QLabel::linkActivated, this, &OverviewView::openClause);
  connect(culprit_, &QLabel::linkActivated, this, [this] { Q_EMIT culpritFixRequested(); });
  connect(kernels_, &QLabel::linkActivated, this,
          [this] { Q_EMIT viewRequested(static_cast<int>(analysis::StoryView::Kernels)); });

  connect(table_->selectionModel(), &QItemSelectionModel::currentRowChanged, this,
          [this](const QModelIndex& current) {
            if (current.isValid()) {
              state_->setComparison(current.data(ComparisonTableModel::kIdRole).toString());
            }
          });
  connect(state_, &ExplorerState::documentChanged, this, [this] {
    model_->setResult(state_->document().result);
    // Stories and growth belong to the result: a new one computes them again.
    story_ = nullptr;
    stories_.clear();
  });
}

const analysis::Story& OverviewView::story() const {
  static const analysis::Story none;
  return story_ != nullptr ? *story_ : none;
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
  story_ = &stories_.story(state_->document().result, state_->comparisonId().toStdString());
  headline_->setText(headlineHtml(*story_, /*links=*/true));
  why_->setText(QString::fromStdString(story_->why).toHtmlEscaped());
  why_->setVisible(!story_->why.empty());
  culprit_->setVisible(r->culprit.has_value());
  if (r->culprit) {
    const experiment::CulpritReport& c = *r->culprit;
    const std::vector<int> sizes(r->spec.batch_sizes.begin(), r->spec.batch_sizes.end());
    QString html = QStringLiteral("<b>%1</b>").arg(q(c.headline(sizes)).toHtmlEscaped());
    if (c.found) {
      html += QStringLiteral(" &nbsp;<a href='culprit:use'>%1</a>").arg(tr("use as workaround"));
    }
    culprit_->setText(html);
    QString tip = tr("Culprit finder (%1): %2 trials in %3 s; %4")
                      .arg(q(std::string(ops::strategy_name(c.strategy))))
                      .arg(c.trials.size())
                      .arg(c.wall_s, 0, 'f', 1)
                      .arg(q(c.verdict));
    for (const experiment::CulpritCost& k : c.costs) {
      tip += tr("\nB=%1: %2").arg(k.batch_size).arg(q(k.detail()));
    }
    culprit_->setToolTip(tip);
  }
  // Beside the first divergence: the kernels of the op behind it, what differs in bold.
  const experiment::ComparisonResult* c = state_->comparison();
  const std::vector<std::string> lines =
      c != nullptr ? analysis::first_divergence_kernels(*r, *c) : std::vector<std::string>{};
  kernels_->setVisible(!lines.empty());
  if (!lines.empty()) {
    QStringList parts;
    for (const std::string& line : lines) {
      const QString text = q(line).toHtmlEscaped();
      parts << (text.contains(QStringLiteral(" differs: ")) ? QStringLiteral("<b>%1</b>").arg(text)
                                                            : text);
    }
    kernels_->setText(tr("Kernels: %1 &nbsp;<a href='kernels:view'>all ops…</a>")
                          .arg(parts.join(QStringLiteral("<br>"))));
  }
  const experiment::ExactAtDivergence* exact =
      c != nullptr && r->exact ? r->exact->find(c->id) : nullptr;
  exact_->setVisible(exact != nullptr);
  if (exact != nullptr) {
    QStringList parts;
    for (const std::string& line : experiment::exact_lines(*exact)) {
      parts << q(line).toHtmlEscaped();
    }
    exact_->setText(tr("Exact (fp64): %1").arg(parts.join(QStringLiteral("<br>"))));
  }
  fillGrowth();
}

QString OverviewView::headlineHtml(const analysis::Story& story, bool links) {
  QString html;
  for (std::size_t i = 0; i < story.clauses.size(); ++i) {
    const QString text = QString::fromStdString(story.clauses[i].text).toHtmlEscaped();
    if (i > 0) {
      html += QStringLiteral(" → ");
    }
    html += links ? QStringLiteral(
                        "<a href='clause:%1' style='color:#123d73; "
                        "text-decoration:none'>%2</a>")
                        .arg(i)
                        .arg(text)
                  : text;
  }
  return html.isEmpty() ? html : QStringLiteral("<b>%1.</b>").arg(html);
}

void OverviewView::openClause(const QString& link) {
  bool ok = false;
  const int i = link.section(QLatin1Char(':'), 1).toInt(&ok);
  if (!ok || i < 0 || static_cast<std::size_t>(i) >= story().clauses.size()) {
    return;
  }
  // A copy: the clause's tap and cell change the selection, which redraws.
  const analysis::StoryClause clause = story().clauses[static_cast<std::size_t>(i)];
  if (clause.workaround) {
    state_->setShowWorkaround(true);
  }
  if (!clause.tap.empty() && state_->result() != nullptr) {
    const int tap = tapIndex(*state_->result(), clause.tap.c_str());
    if (tap >= 0) {
      state_->setTap(tap);
    }
  }
  // A clause about a layer (the routing flip) needs a per-layer tap to show that layer.
  if (clause.tap.empty() && clause.layer_slot >= 0 && clause.layer_slot < state_->layers() &&
      !state_->tapIsPerLayer(state_->tap()) && state_->result() != nullptr) {
    for (const char* name : {"router.topk_ids", "router.scores", "moe.out", "layer.out"}) {
      if (const int tap = tapIndex(*state_->result(), name); tap >= 0) {
        state_->setTap(tap);
        break;
      }
    }
  }
  if (clause.tick >= 0) {
    state_->setCell(clause.tick, clause.layer_slot >= 0 ? clause.layer_slot : state_->layerSlot());
  }
  if (clause.position >= 0) {
    state_->setPosition(static_cast<int>(clause.position));
  }
  Q_EMIT viewRequested(static_cast<int>(clause.view));
}

void OverviewView::fillGrowth() {
  growth_->clearGraphs();
  const auto* r = state_->result();
  const auto* selected = state_->comparison();
  if (r == nullptr || selected == nullptr) {
    growth_->replot(QCustomPlot::rpQueuedReplot);
    return;
  }
  // Okabe-Ito: distinguishable with any colour vision.
  static const QColor colours[] = {QColor(0xe6, 0x9f, 0x00), QColor(0x56, 0xb4, 0xe9),
                                   QColor(0x00, 0x9e, 0x73), QColor(0xd5, 0x5e, 0x00),
                                   QColor(0x00, 0x72, 0xb2), QColor(0xcc, 0x79, 0xa7),
                                   QColor(0x00, 0x00, 0x00)};
  const bool workaround_group =
      experiment::group_of_run(selected->id) == experiment::RunGroup::Workaround;
  double lowest = 1.0;
  int ticks = 0;
  int n = 0;
  // Steps where nothing differs (0, which a log axis cannot show) are drawn on the axis floor,
  // so the onset shows as the step where a curve leaves the bottom edge; the floor is known once
  // every curve is in.
  struct Curve {
    QCPGraph* graph;
    QVector<double> xs;
    QVector<double> ys;
  };
  std::vector<Curve> curves;
  const auto add = [&](const QVector<double>& ys, const QString& name, const QPen& pen) {
    Curve curve{growth_->addGraph(), {}, {}};
    for (int t = 0; t < ys.size(); ++t) {
      if (!std::isnan(ys[t])) {
        curve.xs << t;
        curve.ys << ys[t];
        if (ys[t] > 0) {
          lowest = std::min(lowest, ys[t]);
        }
      }
    }
    curve.graph->setName(name);
    curve.graph->setPen(pen);
    curve.graph->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssDisc, 3));
    curves.push_back(std::move(curve));
  };
  for (const auto& c : r->comparisons) {
    if (c.kind != experiment::ComparisonKind::Row0 ||
        (experiment::group_of_run(c.id) == experiment::RunGroup::Workaround) != workaround_group) {
      continue;
    }
    const analysis::Growth& g = stories_.growth(state_->document().result, c);
    ticks = std::max(ticks, static_cast<int>(g.positions.size()));
    const QColor colour = colours[n++ % std::size(colours)];
    QPen pen(colour, c.id == selected->id ? 2.5 : 1.5);
    const auto* run = r->run(c.run);
    const QString who = run == nullptr         ? QString::fromStdString(c.run)
                        : run->batch_size == 1 ? tr("B=1 repeat")
                                               : QStringLiteral("B=%1").arg(run->batch_size);
    add(QVector<double>(g.positions.begin(), g.positions.end()), tr("%1: positions").arg(who), pen);
    if (c.id == selected->id) {
      pen.setStyle(Qt::DashLine);
      add(QVector<double>(g.elements.begin(), g.elements.end()), tr("%1: elements").arg(who), pen);
    }
  }
  growth_->xAxis->setRange(-0.5, std::max(ticks, 1) - 0.5);
  setStepAxis(growth_->xAxis, *state_);
  // At least three decades, so a curve at 100 % reads as "all" and not as a mid-plot line.
  const double floor = std::pow(10.0, std::floor(std::log10(std::min(lowest, 1e-3))));
  for (Curve& curve : curves) {
    for (double& y : curve.ys) {
      y = y > 0 ? y : floor;
    }
    curve.graph->setData(curve.xs, curve.ys, /*alreadySorted=*/true);
  }
  growth_->yAxis->setRange(floor, 1.5);
  fitLegend(growth_->width());
  growth_->replot(QCustomPlot::rpQueuedReplot);
}

void OverviewView::fitLegend(int width) {
  // As many legend columns as fit the plot's width (at most 4): a figure narrower than the
  // window keeps its legend inside.
  const QFontMetrics metrics(growth_->legend->font());
  int widest = 0;
  for (int i = 0; i < growth_->legend->itemCount(); ++i) {
    if (auto* item = qobject_cast<QCPPlottableLegendItem*>(growth_->legend->item(i))) {
      widest = std::max(widest, metrics.horizontalAdvance(item->plottable()->name()));
    }
  }
  const QSize icon = growth_->legend->iconSize();
  const int item_width = widest + icon.width() + growth_->legend->iconTextPadding() + 24;
  const int columns = std::clamp(width / std::max(item_width, 1), 1, 4);
  if (columns != growth_->legend->wrap()) {
    growth_->legend->setWrap(columns);
    growth_->legend->setFillOrder(QCPLegend::foColumnsFirst, /*rearrange=*/true);
  }
}

bool OverviewView::eventFilter(QObject* watched, QEvent* event) {
  if (watched == growth_ && event->type() == QEvent::Resize) {
    fitLegend(static_cast<QResizeEvent*>(event)->size().width());
  }
  return CoalescedView::eventFilter(watched, event);
}

QPixmap OverviewView::renderGrowth(const QSize& size) {
  flush();
  fitLegend(size.width());
  QPixmap pixmap = growth_->toPixmap(size.width(), size.height());
  fitLegend(growth_->width());
  return pixmap;
}

QString OverviewView::detailsHtml() const {
  const auto* r = state_->result();
  if (r == nullptr) {
    return {};
  }
  const auto& p = r->provenance;
  QString html;
  html += QStringLiteral("<p><b>%1</b></p>").arg(provenanceBanner(*r).toHtmlEscaped());
  if (const auto* floor = r->comparison(experiment::noise_floor_comparison())) {
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
      policyLabel(r->spec.policy) + (p.emulated ? tr(" (EMULATED split-K)") : QString()));
  row(tr("Workaround"), r->spec.workaround ? policyLabel(*r->spec.workaround) : tr("none"));
  if (const std::string switches = r->spec.load.switches.describe(); !switches.empty()) {
    row(tr("Switches"), q(switches));
  }
  row(tr("Sampling"), tr("mode %1, rng %2, prefill %3, seed %4")
                          .arg(QString::fromLatin1(experiment::name(r->spec.mode)),
                               QString::fromLatin1(generation::name(r->spec.rng)),
                               QString::fromLatin1(generation::name(r->spec.prefill)))
                          .arg(r->spec.seed));
  row(tr("Batch rows"), q(experiment::describe(r->spec.composition)));
  if (r->causes) {
    row(tr("Row under test"), q(r->causes->layout_text()));
    row(tr("Causes"), r->causes->verdict.empty()
                          ? tr("not separated (run with companions and without --no-causes)")
                          : q(r->causes->verdict));
  }
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
  const QString headline =
      headlineHtml(story(), /*links=*/false) +
      (story().why.empty()
           ? QString()
           : QStringLiteral("<p>%1</p>").arg(QString::fromStdString(story().why).toHtmlEscaped()));
  // The headline above the comparisons, the table wide enough for whole words.
  return composeDocuments(size, tr("Overview"),
                          {tr("Headline and comparisons"), tr("Provenance and runs")},
                          {headline + table, detailsHtml()}, {3, 2});
}

}  // namespace batchlens::ui
