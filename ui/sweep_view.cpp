// SPDX-License-Identifier: Apache-2.0
#include "ui/sweep_view.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include <QComboBox>
#include <QDir>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QPushButton>
#include <QSignalBlocker>
#include <QSplitter>
#include <QTableWidget>
#include <QToolTip>
#include <QVBoxLayout>

#include "core/base/input.h"
#include "core/experiment/provenance.h"
#include "core/ops/policy.h"
#include "ui/app_filter.h"
#include "ui/qcp.h"
#include "ui/views.h"

namespace batchlens::ui {

namespace {

using analysis::SweepRow;
using analysis::SweepStats;

constexpr QRgb kMain = 0xc0392b;
constexpr QRgb kWorkaround = 0x27ae60;

QString groupLabel(experiment::RunGroup group) {
  return group == experiment::RunGroup::Main ? QObject::tr("default") : QObject::tr("workaround");
}

QTableWidgetItem* cell(const QVariant& value, const QString& tooltip = {}) {
  auto* c = new QTableWidgetItem;
  c->setData(Qt::DisplayRole, value);
  c->setToolTip(tooltip);
  return c;
}

QString promptText(const analysis::SweepSpec& spec, int prompt) {
  if (prompt < 0 || prompt >= static_cast<int>(spec.prompts.size())) {
    return QStringLiteral("?");
  }
  const setup::Prompt& p = spec.prompts[static_cast<std::size_t>(prompt)];
  return p.ids.empty() ? QString::fromStdString(p.text)
                       : QObject::tr("(%1 token ids)").arg(p.ids.size());
}

QString firstText(const SweepRow& r) {
  if (r.first_step < 1) {
    return QObject::tr("none");
  }
  return QStringLiteral("c%1 s%2 %3%4")
      .arg(r.first_canvas + 1)
      .arg(r.first_step)
      .arg(r.first_layer >= 0 ? QStringLiteral("L%1 ").arg(r.first_layer) : QString())
      .arg(QString::fromStdString(r.first_tap));
}

void stylePlot(QCustomPlot* p, const QString& y_label) {
  p->setMinimumHeight(220);
  p->yAxis->setLabel(y_label);
  p->legend->setVisible(true);
  p->legend->setFont(QFont(p->font().family(), 8));
  p->axisRect()->insetLayout()->setInsetAlignment(0, Qt::AlignTop | Qt::AlignHCenter);
}

}  // namespace

SweepView::SweepView(QWidget* parent) : QWidget(parent) {
  caption_ = new QLabel(tr("No sweep is open. Open a sweep file with File ▸ Open "
                           "(batchlens-cli sweep writes DIR/sweep.h5; sweep-merge joins shard "
                           "files), or the embedded sample below, to see how often the batch "
                           "size changes the text across prompts and seeds."),
                        this);
  caption_->setObjectName(QStringLiteral("SweepCaption"));
  caption_->setWordWrap(true);
  caption_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  batch_rows_ = new QComboBox(this);
  batch_rows_->setObjectName(QStringLiteral("SweepBatchRows"));
  batch_rows_->setToolTip(
      tr("Which items the plots and counts below take: every item, or those of one set of "
         "companion prompts and/or one row under test (the sweep's axes of a mixed batch)"));
  connect(batch_rows_, &QComboBox::currentIndexChanged, this, [this] {
    if (!doc_.sweep) {
      return;
    }
    computeStats();
    fillShare();
    fillSteps();
    fillFamilies();
  });
  share_ = new QCustomPlot(this);
  share_->setObjectName(QStringLiteral("SweepSharePlot"));
  share_->setToolTip(QString());
  stylePlot(share_, tr("texts changed (%), 95 % Wilson interval"));
  connect(share_, &QCustomPlot::mouseMove, this, &SweepView::shareHover);
  steps_ = new QCustomPlot(this);
  steps_->setObjectName(QStringLiteral("SweepStepPlot"));
  stylePlot(steps_, tr("items"));
  steps_->xAxis->setLabel(tr("first divergence: canvas, step"));
  families_ = new QTableWidget(this);
  families_->setObjectName(QStringLiteral("SweepFamilies"));
  families_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  families_->verticalHeader()->hide();
  families_->setToolTip(tr("The op families behind the tap where each item first diverged"));
  items_ = new QTableWidget(this);
  items_->setObjectName(QStringLiteral("SweepItems"));
  items_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  items_->setSelectionBehavior(QAbstractItemView::SelectRows);
  items_->setSelectionMode(QAbstractItemView::SingleSelection);
  items_->verticalHeader()->hide();
  items_->setWordWrap(false);
  items_->horizontalHeader()->setStretchLastSection(true);
  items_->setToolTip(
      tr("Double-click an item: open its kept experiment, or re-run it as a full "
         "experiment"));
  open_ = new QPushButton(tr("Open item…"), this);
  open_->setObjectName(QStringLiteral("SweepOpenItem"));
  open_->setEnabled(false);
  connect(items_, &QTableWidget::cellDoubleClicked, this, [this](int row, int) {
    if (const QTableWidgetItem* c = items_->item(row, 0); c != nullptr) {
      Q_EMIT itemActivated(c->data(Qt::UserRole).toInt());
    }
  });
  connect(items_, &QTableWidget::itemSelectionChanged, this, [this] {
    const int item = selectedItem();
    open_->setEnabled(item >= 0);
    open_->setText(item < 0 ? tr("Open item…")
                   : keptExperiment(item).isEmpty()
                       ? tr("Re-run item %1 as a full experiment…").arg(item)
                       : tr("Open item %1's experiment").arg(item));
  });
  connect(open_, &QPushButton::clicked, this, [this] {
    if (selectedItem() >= 0) {
      Q_EMIT itemActivated(selectedItem());
    }
  });

  auto* plots = new QHBoxLayout;
  plots->addWidget(share_, 3);
  plots->addWidget(steps_, 3);
  plots->addWidget(families_, 2);
  auto* top = new QWidget(this);
  top->setLayout(plots);
  auto* bottom = new QWidget(this);
  auto* bl = new QVBoxLayout(bottom);
  bl->setContentsMargins(0, 0, 0, 0);
  bl->addWidget(items_, 1);
  auto* buttons = new QHBoxLayout;
  buttons->addStretch(1);
  buttons->addWidget(open_);
  bl->addLayout(buttons);
  auto* split = new QSplitter(Qt::Vertical, this);
  split->addWidget(top);
  split->addWidget(bottom);
  split->setStretchFactor(0, 1);
  split->setStretchFactor(1, 1);
  content_ = split;
  // No sweep yet: a way to one instead of empty axes (issue #34).
  sample_ =
      new QPushButton(tr("Open the embedded sweep sample (26B-A4B architecture, H200)"), this);
  sample_->setObjectName(QStringLiteral("SweepOpenSample"));
  connect(sample_, &QPushButton::clicked, this, &SweepView::sampleRequested);
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(caption_);
  layout->addWidget(batch_rows_, 0, Qt::AlignLeft);
  layout->addWidget(sample_, 0, Qt::AlignLeft);
  layout->addWidget(split, 1);
  layout->addStretch(0);
  content_->hide();
}

void SweepView::computeStats() {
  stats_.clear();
  if (!doc_.sweep) {
    return;
  }
  const analysis::SweepRecords& s = *doc_.sweep;
  const QStringList pick = batch_rows_->currentData().toString().split(QLatin1Char(','));
  const int companions = pick.size() == 2 ? pick[0].toInt() : -1;
  const std::int64_t row = pick.size() == 2 ? pick[1].toLongLong() : -1;
  stats_ = analysis::sweep_stats(s.spec, analysis::rows_where(s.spec, s.rows, companions, row),
                                 {false, false});
}

void SweepView::setSweep(const SweepDocument& document) {
  doc_ = document;
  {
    const QSignalBlocker block(batch_rows_);
    batch_rows_->clear();
    if (doc_.sweep && doc_.sweep->spec.mixed()) {
      const analysis::SweepSpec& spec = doc_.sweep->spec;
      const auto sets = static_cast<int>(spec.companion_sets.size());
      const auto label = [&](int c) {
        return QString::fromStdString(analysis::companions_label(spec, c));
      };
      batch_rows_->addItem(tr("Batch rows: every item"), QStringLiteral("-1,-1"));
      for (int c = 0; sets > 1 && c < sets; ++c) {
        batch_rows_->addItem(tr("Batch rows: %1").arg(label(c)), QStringLiteral("%1,-1").arg(c));
      }
      for (std::size_t r = 0; spec.rows.size() > 1 && r < spec.rows.size(); ++r) {
        batch_rows_->addItem(tr("Batch rows: prompt in row %1").arg(spec.rows[r]),
                             QStringLiteral("-1,%1").arg(spec.rows[r]));
      }
      for (int c = 0; sets > 1 && spec.rows.size() > 1 && c < sets; ++c) {
        for (const std::int64_t row : spec.rows) {
          batch_rows_->addItem(tr("Batch rows: %1, prompt in row %2").arg(label(c)).arg(row),
                               QStringLiteral("%1,%2").arg(c).arg(row));
        }
      }
    }
    batch_rows_->setVisible(batch_rows_->count() > 0);
  }
  computeStats();
  content_->setVisible(doc_.sweep != nullptr);
  sample_->setVisible(doc_.sweep == nullptr);
  if (!doc_.sweep) {
    return;
  }
  const analysis::SweepRecords& s = *doc_.sweep;
  const experiment::ExperimentSpec& b = s.spec.base;
  std::set<std::string> hosts;
  for (const experiment::Provenance& p : s.provenances) {
    hosts.insert(p.host + " (" + p.device_name + ")");
  }
  QStringList where;
  for (const std::string& h : hosts) {
    where << QString::fromStdString(h);
  }
  caption_->setText(
      tr("<b>Sweep %1</b>: %2 on %3 (%4), %5 prompt(s) × %6 seed(s), %7 items finished of %8; "
         "policy %9%10. Computed on %11.%12")
          .arg(QString::fromStdString(s.id),
               QString::fromStdString(b.model.describe()).toHtmlEscaped(),
               QString::fromStdString(b.load.device), QString::fromStdString(b.load.dtype))
          .arg(s.spec.prompts.size())
          .arg(s.spec.seeds.size())
          .arg(s.items_done)
          .arg(s.items_total)
          .arg(policyLabel(b.policy),
               b.workaround ? tr(", workaround %1").arg(policyLabel(*b.workaround)) : QString(),
               where.join(QStringLiteral(", ")).toHtmlEscaped(),
               s.shards.size() > 1 ? tr(" %1 shard files merged.").arg(s.shards.size())
                                   : QString()));
  caption_->setToolTip(doc_.path);
  fillShare();
  fillSteps();
  fillFamilies();
  fillItems();
}

QString SweepView::shareTooltip(experiment::RunGroup group, int batch_size) const {
  for (const SweepStats& st : stats_) {
    if (st.group == group && st.batch_size == batch_size) {
      return tr("%1, B=%2: text changed in %3 of %4 items (%5 %; 95 % interval %6–%7 %)\n"
                "tokens changed: median %8, max %9; stop changed %10, steps changed %11")
          .arg(groupLabel(st.group))
          .arg(st.batch_size)
          .arg(st.text_changed)
          .arg(st.n)
          .arg(100.0 * st.text_changed / std::max(1, st.n), 0, 'f', 1)
          .arg(100.0 * st.changed_ci.lo, 0, 'f', 1)
          .arg(100.0 * st.changed_ci.hi, 0, 'f', 1)
          .arg(st.tokens_changed_median)
          .arg(st.tokens_changed_max)
          .arg(st.stop_changed)
          .arg(st.steps_changed);
    }
  }
  return {};
}

void SweepView::fillShare() {
  share_->clearPlottables();
  share_->clearItems();
  std::vector<int> sizes;
  for (const SweepStats& st : stats_) {
    if (std::find(sizes.begin(), sizes.end(), st.batch_size) == sizes.end()) {
      sizes.push_back(st.batch_size);
    }
  }
  std::sort(sizes.begin(), sizes.end());
  const bool two = std::any_of(stats_.begin(), stats_.end(), [](const SweepStats& s) {
    return s.group != experiment::RunGroup::Main;
  });
  for (const experiment::RunGroup group :
       {experiment::RunGroup::Main, experiment::RunGroup::Workaround}) {
    QVector<double> keys;
    QVector<double> values;
    QVector<double> lo;
    QVector<double> hi;
    for (const SweepStats& st : stats_) {
      if (st.group != group) {
        continue;
      }
      const auto at = std::find(sizes.begin(), sizes.end(), st.batch_size) - sizes.begin();
      const double p = 100.0 * st.text_changed / std::max(1, st.n);
      keys << static_cast<double>(at) +
                  (two ? (group == experiment::RunGroup::Main ? -0.2 : 0.2) : 0.0);
      values << p;
      lo << p - 100.0 * st.changed_ci.lo;
      hi << 100.0 * st.changed_ci.hi - p;
    }
    if (keys.isEmpty()) {
      continue;
    }
    auto* bars = new QCPBars(share_->xAxis, share_->yAxis);
    bars->setName(tr("%1 (k/N changed)").arg(groupLabel(group)));
    bars->setData(keys, values, true);
    bars->setWidth(two ? 0.38 : 0.6);
    const QColor c(group == experiment::RunGroup::Main ? kMain : kWorkaround);
    bars->setBrush(c.lighter(130));
    bars->setPen(QPen(c));
    auto* errors = new QCPErrorBars(share_->xAxis, share_->yAxis);
    errors->removeFromLegend();
    errors->setDataPlottable(bars);
    errors->setData(lo, hi);
    errors->setPen(QPen(Qt::black));
    // k/N on each bar: the count a maintainer quotes ("0/24 changed").
    int k = 0;
    for (const SweepStats& st : stats_) {
      if (st.group != group) {
        continue;
      }
      auto* label = new QCPItemText(share_);
      label->position->setCoords(keys[k], std::min(values[k] + hi[k], 100.0) + 4.0);
      label->setText(QStringLiteral("%1/%2").arg(st.text_changed).arg(st.n));
      label->setFont(QFont(share_->font().family(), 8, QFont::Bold));
      label->setColor(c.darker(130));
      ++k;
    }
  }
  auto ticker = QSharedPointer<QCPAxisTickerText>::create();
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    ticker->addTick(static_cast<double>(i), QStringLiteral("B=%1").arg(sizes[i]));
  }
  share_->xAxis->setTicker(ticker);
  share_->xAxis->setRange(-0.7, static_cast<double>(sizes.size()) - 0.3);
  share_->yAxis->setRange(0, 135);
  auto percent = QSharedPointer<QCPAxisTickerText>::create();
  for (int v = 0; v <= 100; v += 20) {
    percent->addTick(v, QString::number(v));
  }
  share_->yAxis->setTicker(percent);
  share_->xAxis->setLabel(tr("batch size (row 0 against B=1)"));
  share_->replot();
}

void SweepView::fillSteps() {
  steps_->clearPlottables();
  std::set<std::pair<int, int>> at;
  for (const SweepStats& st : stats_) {
    for (const auto& [where, count] : st.first_steps) {
      at.insert(where);
    }
  }
  const std::vector<std::pair<int, int>> cats(at.begin(), at.end());
  auto* group = new QCPBarsGroup(steps_);
  int series = 0;
  for (const SweepStats& st : stats_) {
    if (st.first_steps.empty()) {
      continue;
    }
    QVector<double> keys;
    QVector<double> values;
    for (std::size_t i = 0; i < cats.size(); ++i) {
      const auto it = st.first_steps.find(cats[i]);
      keys << static_cast<double>(i);
      values << (it != st.first_steps.end() ? it->second : 0);
    }
    auto* bars = new QCPBars(steps_->xAxis, steps_->yAxis);
    bars->setName(tr("%1 B=%2").arg(groupLabel(st.group)).arg(st.batch_size));
    bars->setData(keys, values, true);
    const QColor base(st.group == experiment::RunGroup::Main ? kMain : kWorkaround);
    const QColor c = base.lighter(100 + 25 * (series % 4));
    bars->setBrush(c);
    bars->setPen(QPen(base));
    bars->setWidth(0.8 / std::max(1, static_cast<int>(stats_.size())));
    bars->setBarsGroup(group);
    ++series;
  }
  auto ticker = QSharedPointer<QCPAxisTickerText>::create();
  for (std::size_t i = 0; i < cats.size(); ++i) {
    ticker->addTick(static_cast<double>(i),
                    QStringLiteral("c%1 s%2").arg(cats[i].first + 1).arg(cats[i].second));
  }
  steps_->xAxis->setTicker(ticker);
  steps_->xAxis->setRange(-0.7, std::max<double>(1.0, static_cast<double>(cats.size()) - 0.3));
  double top = 1;
  for (const SweepStats& st : stats_) {
    for (const auto& [where, count] : st.first_steps) {
      top = std::max<double>(top, count);
    }
  }
  steps_->yAxis->setRange(0, top * 1.6);  // room for the legend above the bars
  steps_->legend->setVisible(series > 0);
  steps_->setToolTip(cats.empty() ? tr("No item diverged: every compared tap was bitwise equal")
                                  : tr("How many items first diverged at each canvas and step"));
  steps_->replot();
}

void SweepView::fillFamilies() {
  std::set<std::string> names;
  for (const SweepStats& st : stats_) {
    for (const auto& [families, count] : st.first_families) {
      names.insert(families);
    }
  }
  families_->clear();
  families_->setColumnCount(static_cast<int>(stats_.size()) + 1);
  QStringList header{tr("First divergent op families")};
  for (const SweepStats& st : stats_) {
    header << tr("%1 B=%2").arg(groupLabel(st.group)).arg(st.batch_size);
  }
  families_->setHorizontalHeaderLabels(header);
  families_->setRowCount(static_cast<int>(names.size()));
  int row = 0;
  for (const std::string& name : names) {
    families_->setItem(row, 0, cell(QString::fromStdString(name)));
    for (std::size_t c = 0; c < stats_.size(); ++c) {
      const auto it = stats_[c].first_families.find(name);
      const int k = it != stats_[c].first_families.end() ? it->second : 0;
      families_->setItem(row, static_cast<int>(c) + 1,
                         cell(QStringLiteral("%1/%2").arg(k).arg(stats_[c].n)));
    }
    ++row;
  }
  families_->resizeColumnsToContents();
}

void SweepView::fillItems() {
  const analysis::SweepRecords& s = *doc_.sweep;
  items_->setSortingEnabled(false);
  items_->clear();
  QStringList header{
      tr("Item"),        tr("Prompt"),         tr("Seed"),    tr("Kernels"), tr("B"),
      tr("Text"),        tr("Tokens changed"), tr("Stop"),    tr("Steps"),   tr("First divergence"),
      tr("Op families"), tr("Computed on"),    tr("Wall (s)")};
  const bool mixed = s.spec.mixed();
  const std::vector<analysis::SweepItem> all = analysis::sweep_items(s.spec);
  if (mixed) {
    header << tr("Batch rows");
  }
  items_->setColumnCount(static_cast<int>(header.size()));
  items_->setHorizontalHeaderLabels(header);
  items_->setRowCount(static_cast<int>(s.rows.size()));
  for (int i = 0; i < static_cast<int>(s.rows.size()); ++i) {
    const SweepRow& r = s.rows[static_cast<std::size_t>(i)];
    const QString prompt = promptText(s.spec, r.prompt);
    auto* first = cell(r.item);
    first->setData(Qt::UserRole, r.item);
    items_->setItem(i, 0, first);
    items_->setItem(i, 1, cell(prompt.left(60), prompt));
    items_->setItem(i, 2, cell(QString::number(r.seed)));
    items_->setItem(i, 3, cell(groupLabel(r.group)));
    items_->setItem(i, 4, cell(r.batch_size));
    auto* text = cell(r.text_changed ? tr("changed") : tr("same"));
    text->setBackground(r.text_changed ? QColor(0xfc, 0xd5, 0xce) : QColor(0xd5, 0xf5, 0xe3));
    items_->setItem(i, 5, text);
    items_->setItem(i, 6,
                    cell(QVariant::fromValue<qlonglong>(r.tokens_changed),
                         tr("%1 token edits against the B=1 reference's %2 tokens")
                             .arg(r.tokens_changed)
                             .arg(r.tokens_total)));
    items_->setItem(i, 7, cell(r.stop_changed ? tr("changed") : tr("same")));
    items_->setItem(i, 8, cell(r.steps_changed ? tr("changed") : tr("same")));
    items_->setItem(i, 9, cell(firstText(r)));
    items_->setItem(i, 10, cell(QString::fromStdString(r.first_families)));
    const bool known = r.provenance >= 0 && r.provenance < static_cast<int>(s.provenances.size());
    const experiment::Provenance* p =
        known ? &s.provenances[static_cast<std::size_t>(r.provenance)] : nullptr;
    items_->setItem(i, 11,
                    cell(p != nullptr ? QString::fromStdString(p->host + ": " + p->device_name)
                                      : QStringLiteral("?"),
                         p != nullptr ? QString::fromStdString(base::dump_json_lossy(
                                            experiment::provenance_to_json(*p), 1))
                                      : QString()));
    items_->setItem(i, 12, cell(QString::number(r.wall_s, 'f', 1)));
    if (mixed && r.item >= 0 && static_cast<std::size_t>(r.item) < all.size()) {
      const analysis::SweepItem& item = all[static_cast<std::size_t>(r.item)];
      items_->setItem(
          i, 13,
          cell(tr("%1, prompt in row %2")
                   .arg(QString::fromStdString(analysis::companions_label(s.spec, item.companions)))
                   .arg(item.row)));
    }
  }
  items_->resizeColumnsToContents();
  items_->setColumnWidth(1, std::min(items_->columnWidth(1), 320));
  items_->setSortingEnabled(true);
}

int SweepView::selectedItem() const {
  const auto rows = items_->selectionModel() != nullptr ? items_->selectionModel()->selectedRows()
                                                        : QModelIndexList{};
  if (rows.isEmpty()) {
    return -1;
  }
  const QTableWidgetItem* c = items_->item(rows.front().row(), 0);
  return c != nullptr ? c->data(Qt::UserRole).toInt() : -1;
}

QString SweepView::keptExperiment(int item) const {
  if (doc_.path.isEmpty() || doc_.path.startsWith(QStringLiteral(":/"))) {
    return {};
  }
  const QFileInfo info(doc_.path);
  const QDir dir = info.isDir() ? QDir(info.absoluteFilePath()) : info.absoluteDir();
  const QString name =
      QString::fromStdString(analysis::kept_experiment(".", item).filename().string());
  for (const QString& candidate : {dir.filePath(QStringLiteral("experiments/") + name),
                                   dir.filePath(QStringLiteral("../experiments/") + name)}) {
    if (QFileInfo(candidate).isFile()) {
      return QFileInfo(candidate).absoluteFilePath();
    }
  }
  return {};
}

void SweepView::shareHover(QMouseEvent* event) {
  auto* bars = qobject_cast<QCPBars*>(share_->plottableAt(event->position()));
  if (bars == nullptr || bars->data()->isEmpty()) {
    QToolTip::hideText();
    return;
  }
  const double key = bars->keyAxis()->pixelToCoord(event->position().x());
  const auto index = static_cast<int>(std::lround(key - bars->data()->at(0)->key));
  const experiment::RunGroup group = bars->name().startsWith(groupLabel(experiment::RunGroup::Main))
                                         ? experiment::RunGroup::Main
                                         : experiment::RunGroup::Workaround;
  std::vector<int> sizes;
  for (const SweepStats& st : stats_) {
    if (st.group == group) {
      sizes.push_back(st.batch_size);
    }
  }
  if (index < 0 || index >= static_cast<int>(sizes.size())) {
    return;
  }
  QToolTip::showText(event->globalPosition().toPoint(),
                     wrappedToolTip(shareTooltip(group, sizes[static_cast<std::size_t>(index)])),
                     share_);
}

QPixmap SweepView::renderReport(const QSize& size) {
  const QSize old = this->size();
  resize(size);
  QPixmap p = grab();
  resize(old);
  return p;
}

}  // namespace batchlens::ui
