// SPDX-License-Identifier: Apache-2.0
// Text diff: the generated text of row 0, reference vs run, and a replay of both canvases at
// each denoising step.
#include <algorithm>
#include <cmath>

#include <QHBoxLayout>
#include <QLabel>
#include <QResizeEvent>
#include <QScrollBar>
#include <QSlider>
#include <QSplitter>
#include <QTextBrowser>
#include <QTextOption>
#include <QVBoxLayout>

#include "ui/report_render.h"
#include "ui/views.h"

namespace batchlens::ui {

namespace {

constexpr const char* kChanged = "background-color:#fcd5ce;";
constexpr const char* kDeleted = "background-color:#fcd5ce; text-decoration:line-through;";
constexpr const char* kInserted = "background-color:#c7e9c0;";
constexpr const char* kStop = "background-color:#3a3a3a; color:white; font-weight:bold;";

// A zero-width space: a line may break here and nowhere inside a token.
constexpr char16_t kBreak = 0x200B;
// Tokens glued into one word before a break is allowed between them anyway (random weights
// can make very long "words").
constexpr int kMaxGlued = 8;

QString span(const QString& text, const char* style, const QString& title = {}) {
  QString body = text.toHtmlEscaped().replace(QLatin1Char(' '), QStringLiteral("&nbsp;"));
  if (style == nullptr || *style == 0) {
    return body;
  }
  return QStringLiteral("<span style=\"%1\" title=\"%2\">%3</span>")
      .arg(QString::fromLatin1(style), title.toHtmlEscaped(), body);
}

// Line breaks between tokens, preferably between words: before a token that starts with a
// space or follows a line end, or after kMaxGlued tokens without one. Never inside a token.
class Breaks {
 public:
  QString before(const QString& token) {
    const bool word_start = token.isEmpty() || token.front().isSpace() ||
                            token.front() == QChar(0x23CE) || last_ended_line_;
    last_ended_line_ =
        token.endsWith(QChar(0x23CE)) || (!token.isEmpty() && token.back().isSpace());
    if (word_start || ++glued_ >= kMaxGlued) {
      glued_ = 0;
      return {QChar(kBreak)};
    }
    return {};
  }

 private:
  int glued_ = 0;
  bool last_ended_line_ = false;
};

QString stopMark(const QString& who) {
  return span(QStringLiteral(" ⏹ %1 stop ").arg(who), kStop);
}

// The final text as one inline diff: equal tokens plain, replaced ones as ref→run, deletions
// struck through, insertions green; the stop positions of both runs marked.
QString finalDiffHtml(const experiment::RunResult& ref, const experiment::RunResult& run,
                      const experiment::ComparisonResult& c, const text::Tokenizer* tok) {
  QString html;
  Breaks breaks;
  const auto token = [tok, &breaks, &html](const std::vector<std::int64_t>& tokens,
                                           std::int64_t pos) {
    QString text = pos >= 0 && static_cast<std::size_t>(pos) < tokens.size()
                       ? tokenText(tok, tokens[static_cast<std::size_t>(pos)])
                       : QString();
    html += breaks.before(text);
    return text;
  };
  for (const auto& e : c.token_diff) {
    switch (e.op) {
      case text::TokenEdit::Op::Equal:
        html += span(token(run.tokens, e.run_pos), nullptr);
        break;
      case text::TokenEdit::Op::Replace:
        html += span(token(ref.tokens, e.ref_pos), kDeleted,
                     QObject::tr("reference position %1").arg(e.ref_pos));
        html += span(token(run.tokens, e.run_pos), kInserted,
                     QObject::tr("run position %1").arg(e.run_pos));
        break;
      case text::TokenEdit::Op::Delete:
        html += span(token(ref.tokens, e.ref_pos), kDeleted,
                     QObject::tr("only in the reference, position %1").arg(e.ref_pos));
        break;
      case text::TokenEdit::Op::Insert:
        html += span(token(run.tokens, e.run_pos), kInserted,
                     QObject::tr("only in the run, position %1").arg(e.run_pos));
        break;
    }
    if (e.ref_pos >= 0 && e.ref_pos == ref.stop_position) {
      html += stopMark(QObject::tr("ref"));
    }
    if (e.run_pos >= 0 && e.run_pos == run.stop_position) {
      html += stopMark(QObject::tr("run"));
    }
  }
  return html;
}

// Why a run has no canvas to show at `tick`, or empty when it has one.
QString missingCanvas(const experiment::RunResult& run, int tick) {
  if (run.canvas_in.shape.size() != 2 || elementAt(run.canvas_in, {tick, 0}) == nullptr) {
    return QObject::tr("(%1 did not step there)").arg(QString::fromStdString(run.id));
  }
  const int* canvas = elementAt(run.tick_canvas, tick);
  if (canvas == nullptr || *canvas < 0) {
    return QObject::tr("(%1 took no step there)").arg(QString::fromStdString(run.id));
  }
  return {};
}

// One position of `mine`'s canvas as a table cell: red where it differs from `other`'s token
// there, bold where accepted at this step, boxed when selected. Every read is bounds-checked.
QString canvasCell(const experiment::RunResult& mine, const experiment::RunResult& other, int tick,
                   std::int64_t p, const text::Tokenizer* tok, int selected) {
  const std::int64_t* id = elementAt(mine.canvas_in, {tick, p});
  if (id == nullptr) {
    return QStringLiteral("<td></td>");
  }
  const std::int64_t* other_id = elementAt(other.canvas_in, {tick, p});
  const bool differs = other_id != nullptr && *other_id != *id;
  const std::uint8_t* accepted_flag = elementAt(mine.accepted, {tick, p});
  const bool accepted = accepted_flag != nullptr && *accepted_flag != 0;
  QString style = differs ? QString::fromLatin1(kChanged) : QString();
  if (accepted) {
    style += QStringLiteral("font-weight:bold;");
  }
  if (p == selected) {
    style += QStringLiteral("text-decoration:underline;");
  }
  const QString title = QObject::tr("position %1, id %2%3%4")
                            .arg(p)
                            .arg(*id)
                            .arg(accepted ? QObject::tr(", accepted") : QString())
                            .arg(differs ? QObject::tr(", differs") : QString());
  const QByteArray style_bytes = style.toLatin1();
  return QStringLiteral("<td%1>%2</td>")
      .arg(differs ? QStringLiteral(" bgcolor='#fcd5ce'") : QString(),
           span(tokenText(tok, *id),
                style_bytes.isEmpty() ? "color:inherit;" : style_bytes.constData(), title));
}

// Both canvases at a tick, aligned position by position: blocks of `columns` positions, each a
// row of position numbers, the reference's tokens and the run's tokens in the same columns.
QString alignedCanvasHtml(const experiment::RunResult& ref, const experiment::RunResult& run,
                          int tick, const text::Tokenizer* tok, int selected,
                          std::int64_t columns) {
  const QString ref_missing = missingCanvas(ref, tick);
  const QString run_missing = missingCanvas(run, tick);
  if (!ref_missing.isEmpty() && !run_missing.isEmpty()) {
    return QStringLiteral("<p><i>%1 %2</i></p>").arg(ref_missing, run_missing);
  }
  const std::int64_t positions =
      std::max(ref.canvas_in.shape.size() == 2 ? ref.canvas_in.shape[1] : 0,
               run.canvas_in.shape.size() == 2 ? run.canvas_in.shape[1] : 0);
  const QString ref_label = QObject::tr("ref");
  const QString run_label = QObject::tr("run");
  QString html = QStringLiteral(
      "<table cellspacing='0' cellpadding='2' style='font-family:monospace; "
      "border-collapse:collapse'>");
  for (std::int64_t start = 0; start < positions; start += columns) {
    const std::int64_t end = std::min(positions, start + columns);
    html +=
        QStringLiteral("<tr><td style='color:#777'><small>%1</small></td>").arg(QObject::tr("pos"));
    for (std::int64_t p = start; p < end; ++p) {
      html += QStringLiteral("<td style='color:#777'><small>%1</small></td>").arg(p);
    }
    html += QStringLiteral("</tr><tr><td><b>%1</b></td>").arg(ref_label.toHtmlEscaped());
    for (std::int64_t p = start; p < end; ++p) {
      html += ref_missing.isEmpty() ? canvasCell(ref, run, tick, p, tok, selected)
                                    : QStringLiteral("<td></td>");
    }
    html += QStringLiteral("</tr><tr><td><b>%1</b></td>").arg(run_label.toHtmlEscaped());
    for (std::int64_t p = start; p < end; ++p) {
      html += run_missing.isEmpty() ? canvasCell(run, ref, tick, p, tok, selected)
                                    : QStringLiteral("<td></td>");
    }
    html += QStringLiteral("</tr>");
  }
  html += QStringLiteral("</table>");
  for (const QString& missing : {ref_missing, run_missing}) {
    if (!missing.isEmpty()) {
      html += QStringLiteral("<p><i>%1: nothing to compare</i></p>").arg(missing.toHtmlEscaped());
    }
  }
  return html;
}

}  // namespace

TextDiffView::TextDiffView(ExplorerState* state, QWidget* parent) : CoalescedView(state, parent) {
  slider_ = new QSlider(Qt::Horizontal, this);
  slider_->setObjectName(QStringLiteral("StepSlider"));
  slider_->setToolTip(tr("Replay both canvases as they were at each denoising step"));
  step_label_ = new QLabel(this);
  step_label_->setMinimumWidth(220);
  before_ = new QTextBrowser(this);
  before_->setObjectName(QStringLiteral("TextDiffBefore"));
  after_ = new QTextBrowser(this);
  after_->setObjectName(QStringLiteral("TextDiffAfter"));
  for (QTextBrowser* b : {before_, after_}) {
    // Lines break between tokens (see Breaks), never inside a word's token.
    b->setWordWrapMode(QTextOption::WordWrap);
  }
  // Before and after scroll together: the same place of both texts stays side by side.
  const auto sync = [this](QTextBrowser* from, QTextBrowser* to) {
    connect(from->verticalScrollBar(), &QScrollBar::valueChanged, this, [this, from, to](int v) {
      if (syncing_) {
        return;
      }
      syncing_ = true;
      const int range = std::max(from->verticalScrollBar()->maximum(), 1);
      to->verticalScrollBar()->setValue(static_cast<int>(
          std::lround(static_cast<double>(v) * to->verticalScrollBar()->maximum() / range)));
      syncing_ = false;
    });
  };
  sync(before_, after_);
  sync(after_, before_);
  auto* split = new QSplitter(Qt::Horizontal, this);
  split->addWidget(before_);
  split->addWidget(after_);
  auto* controls = new QHBoxLayout;
  controls->addWidget(new QLabel(tr("Step:"), this));
  controls->addWidget(slider_, 1);
  controls->addWidget(step_label_);
  auto* layout = new QVBoxLayout(this);
  layout->addLayout(controls);
  layout->addWidget(split, 1);
  connect(slider_, &QSlider::valueChanged, this,
          [this](int tick) { state_->setCell(tick, state_->layerSlot()); });
}

QString TextDiffView::html(Side side) const {
  const auto* r = state_->result();
  const auto* c = state_->comparison(side);
  if (r == nullptr || c == nullptr) {
    return {};
  }
  const auto* ref = r->run(c->reference);
  const auto* run = r->run(c->run);
  if (ref == nullptr || run == nullptr) {
    return {};
  }
  const text::Tokenizer* tok = state_->document().tokenizer.get();
  QString html;
  html += QStringLiteral("<h3>%1</h3>").arg(comparisonLabel(*r, *c).toHtmlEscaped());
  if (c->kind == experiment::ComparisonKind::Rows) {
    html += tr("<p>Rows 1.. of %1 against its own row 0 (lockstep): first divergence %2.</p>")
                .arg(QString::fromStdString(c->run).toHtmlEscaped(),
                     QString::fromStdString(experiment::describe(c->first)).toHtmlEscaped());
  } else {
    html += tr("<p><b>Text %1</b>: %2 tokens changed; stop %3 (ref %4, run %5); steps %6.</p>")
                .arg(c->tokens_identical ? tr("identical") : tr("DIFFERS"))
                .arg(c->tokens_changed)
                .arg(c->stop_changed ? tr("CHANGED") : tr("unchanged"))
                .arg(ref->stop_position)
                .arg(run->stop_position)
                .arg(c->steps_changed ? tr("CHANGED") : tr("unchanged"));
    html += QStringLiteral("<p style='font-family:monospace'>%1</p>")
                .arg(finalDiffHtml(*ref, *run, *c, tok));
    if (tok == nullptr) {
      html += tr("<p><i>No tokenizer for this model here: tokens are shown as ids.</i></p>");
    }
  }
  const int tick = state_->tick();
  html += QStringLiteral("<h4>%1</h4>")
              .arg(tr("Canvas in at %1").arg(state_->tickLabel(tick)).toHtmlEscaped());
  html += tr("<p>Reference (%1, row <b>ref</b>) and run (%2, row <b>run</b>) aligned position "
             "by position. Red: the token differs from the other run's at that position; bold: "
             "accepted at this step.</p>")
              .arg(QString::fromStdString(ref->id).toHtmlEscaped(),
                   QString::fromStdString(run->id).toHtmlEscaped());
  // As many positions per block as fit the pane (about 11 characters of monospace each).
  const QTextBrowser* pane = side == Side::Before ? before_ : after_;
  const int char_width = std::max(1, pane->fontMetrics().horizontalAdvance(QLatin1Char('m')));
  const std::int64_t columns = std::clamp<std::int64_t>(
      (pane->viewport()->width() - 6 * char_width) / (11 * char_width), 4, 16);
  html += alignedCanvasHtml(*ref, *run, tick, tok, state_->position(), columns);
  return html;
}

void TextDiffView::resizeEvent(QResizeEvent* event) {
  CoalescedView::resizeEvent(event);
  scheduleRefresh();
}

void TextDiffView::refresh() {
  const int ticks = state_->ticks();
  {
    const QSignalBlocker block(slider_);
    slider_->setRange(0, std::max(ticks - 1, 0));
    slider_->setValue(state_->tick());
  }
  step_label_->setText(tr("%1 (%2 of %3 steps)")
                           .arg(state_->tickLabel(state_->tick()))
                           .arg(state_->tick() + 1)
                           .arg(ticks));
  const int before_scroll = before_->verticalScrollBar()->value();
  before_->setHtml(html(Side::Before));
  before_->verticalScrollBar()->setValue(before_scroll);
  after_->setVisible(state_->hasAfter());
  if (state_->hasAfter()) {
    const int after_scroll = after_->verticalScrollBar()->value();
    after_->setHtml(html(Side::After));
    after_->verticalScrollBar()->setValue(after_scroll);
  }
}

QPixmap TextDiffView::renderReport(const QSize& size) {
  flush();
  QStringList captions{tr("before (as run)")};
  QStringList pages{html(Side::Before)};
  if (state_->hasAfter()) {
    captions << tr("after (row-wise workaround)");
    pages << html(Side::After);
  }
  return composeDocuments(size, tr("Text diff"), captions, pages);
}

}  // namespace batchlens::ui
