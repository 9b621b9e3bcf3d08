// SPDX-License-Identifier: Apache-2.0
// What the explorer's views share: coalesced redraws, comparison labels, token text.
#include <algorithm>

#include <QTimer>

#include "ui/qcp.h"
#include "ui/views.h"

namespace batchlens::ui {

CoalescedView::CoalescedView(ExplorerState* state, QWidget* parent)
    : QWidget(parent), state_(state) {
  connect(state_, &ExplorerState::documentChanged, this, &CoalescedView::scheduleRefresh);
  connect(state_, &ExplorerState::comparisonChanged, this, &CoalescedView::scheduleRefresh);
  connect(state_, &ExplorerState::viewChanged, this, &CoalescedView::scheduleRefresh);
  connect(state_, &ExplorerState::selectionChanged, this, &CoalescedView::scheduleRefresh);
}

void CoalescedView::scheduleRefresh() {
  if (pending_) {
    return;
  }
  pending_ = true;
  QTimer::singleShot(0, this, &CoalescedView::flush);
}

void CoalescedView::flush() {
  if (!pending_) {
    return;
  }
  pending_ = false;
  refresh();
}

QString comparisonLabel(const experiment::ExperimentResult& result,
                        const experiment::ComparisonResult& comparison) {
  const auto describe_run = [&result](const std::string& id) {
    const auto* run = result.run(id);
    switch (experiment::role_of_run(id)) {
      case experiment::RunRole::Repeat:
        return QObject::tr("B=1 repeat");
      case experiment::RunRole::Reference:
        return QObject::tr("B=1 ref");
      case experiment::RunRole::Batched:
        break;
    }
    QString name = QString::fromStdString(id);
    if (experiment::group_of_run(id) == experiment::RunGroup::Workaround) {
      name = name.mid(3);
    }
    return run != nullptr ? QStringLiteral("B=%1").arg(run->batch_size) : name;
  };
  const bool workaround =
      experiment::group_of_run(comparison.run) == experiment::RunGroup::Workaround;
  QString label;
  if (comparison.kind == experiment::ComparisonKind::Rows) {
    label = QObject::tr("%1 rows 1.. vs its row 0").arg(describe_run(comparison.run));
  } else {
    label = QObject::tr("%1 vs %2 row 0")
                .arg(describe_run(comparison.reference), describe_run(comparison.run));
  }
  return workaround ? QObject::tr("workaround: %1").arg(label) : label;
}

void setStepAxis(QCPAxis* axis, const ExplorerState& state) {
  const auto* c = state.comparison();
  const auto* ref =
      c != nullptr && state.result() != nullptr ? state.result()->run(c->reference) : nullptr;
  if (ref == nullptr) {
    return;
  }
  const int ticks = state.ticks();
  const int every = std::max(1, ticks / 12);
  QVector<double> at;
  QVector<QString> labels;
  for (int t = 0; t < ticks; ++t) {
    const int* canvas = elementAt(ref->tick_canvas, t);
    const int* step = elementAt(ref->tick_step, t);
    if (canvas == nullptr || step == nullptr || *canvas < 0) {
      continue;
    }
    // A step label too close to the next canvas's first step would overlap its label.
    const int* next_step = elementAt(ref->tick_step, t + std::max(1, every / 2));
    const bool crowded = next_step != nullptr && *next_step >= 1 && *next_step < *step;
    if (*step == 1 && *canvas > 0) {
      at << t;
      labels << QStringLiteral("c%1·1").arg(*canvas + 1);
    } else if ((*step % every == 0 && !crowded) || *step == 1) {
      at << t;
      labels << QString::number(*step);
    }
  }
  auto ticker = QSharedPointer<QCPAxisTickerText>::create();
  ticker->setTicks(at, labels);
  axis->setTicker(ticker);
}

QString policyLabel(const ops::OpPolicy& policy) {
  const std::string text = ops::policy_text(policy);
  return QString::fromStdString(!text.empty() && text.front() == '{' ? ops::describe(policy)
                                                                     : text);
}

QString tokenText(const text::Tokenizer* tokenizer, std::int64_t id) {
  if (tokenizer == nullptr) {
    return QStringLiteral("#%1").arg(id);
  }
  QString s = QString::fromStdString(tokenizer->decode({id}));
  // Control and unused tokens ("<unused82>", "<start_of_turn>") compactly: a random-weight
  // model samples many, and the full names crowded out the words.
  if (tokenizer->is_special(id) ||
      (s.startsWith(QLatin1Char('<')) && s.endsWith(QLatin1Char('>')) && s.size() > 2 &&
       !s.contains(QLatin1Char(' ')))) {
    QString name = s.mid(1, s.size() - 2);
    if (name.startsWith(QLatin1String("unused"))) {
      name = QStringLiteral("u") + name.mid(6);
    }
    return QStringLiteral("⟨%1⟩").arg(name);
  }
  if (s.isEmpty()) {
    s = QString::fromStdString(tokenizer->piece(id));
  }
  if (s.isEmpty()) {
    return QStringLiteral("#%1").arg(id);
  }
  s.replace(QLatin1Char('\n'), QStringLiteral("⏎"));
  return s;
}

}  // namespace batchlens::ui
