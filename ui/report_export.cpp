// SPDX-License-Identifier: Apache-2.0
#include "ui/report_export.h"

#include <algorithm>
#include <filesystem>
#include <string>

#include <QBuffer>
#include <QDateTime>
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QPainter>
#include <QPixmap>
#include <QTextDocument>

#include "core/analysis/kernel_evidence.h"
#include "core/analysis/story.h"
#include "core/analysis/summary.h"
#include "core/analysis/sweep_report.h"
#include "core/base/atomic_file.h"
#include "core/base/input.h"
#include "core/base/version.h"
#include "core/experiment/command_line.h"
#include "ui/heatmap_plot.h"
#include "ui/qt_text.h"
#include "ui/report_render.h"
#include "ui/sweep_view.h"
#include "ui/views.h"

namespace batchlens::ui {

namespace {

QString yesNo(bool changed, const QString& yes, const QString& no) {
  return changed ? yes : no;
}

// Markdown table cells must not contain '|' or newlines.
QString cell(QString s) {
  return s.replace(QLatin1Char('|'), QStringLiteral("\\|"))
      .replace(QLatin1Char('\n'), QLatin1Char(' '));
}

// A path as the file system spells it (the locale's encoding, not always UTF-8).
std::filesystem::path localPath(const QString& path) {
  return {QFile::encodeName(path).toStdString()};
}

base::Result<void> writeBytes(const std::filesystem::path& path, const QByteArray& bytes) {
  return base::write_file_atomic(
      path, std::string_view(bytes.constData(), static_cast<std::size_t>(bytes.size())));
}

}  // namespace

namespace {

// The tokens a comparison changed, in order: (reference position or -1, reference token or
// -1, run token or -1). Read bounds-checked from the comparison's token diff.
struct ChangedToken {
  std::int64_t position = -1;
  std::int64_t ref = -1;
  std::int64_t run = -1;
};

std::vector<ChangedToken> changedTokens(const experiment::RunResult& ref,
                                        const experiment::RunResult& run,
                                        const experiment::ComparisonResult& c) {
  std::vector<ChangedToken> out;
  for (const text::TokenEdit& e : c.token_diff) {
    if (e.op == text::TokenEdit::Op::Equal) {
      continue;
    }
    ChangedToken t;
    const std::int64_t* a = elementAt(ref.tokens, e.ref_pos);
    const std::int64_t* b = elementAt(run.tokens, e.run_pos);
    t.position = e.ref_pos >= 0 ? e.ref_pos : e.run_pos;
    t.ref = a != nullptr ? *a : -1;
    t.run = b != nullptr ? *b : -1;
    out.push_back(t);
  }
  return out;
}

QString tokenCell(const text::Tokenizer* tokenizer, std::int64_t id) {
  return id < 0
             ? QStringLiteral("(none)")
             : QStringLiteral("`%1`").arg(
                   cell(tokenText(tokenizer, id)).replace(QLatin1Char('`'), QStringLiteral("'")));
}

// The caveats a reader must know before drawing conclusions from this one experiment.
QStringList caveats(const experiment::ExperimentResult& r) {
  QStringList out;
  if (r.spec.model.checkpoint_dir.empty()) {
    out << QStringLiteral(
               "Random weights (preset `%1`, seed %2): the texts are not meaningful language; what "
               "counts is whether and where they differ, which depends on the kernels, not on "
               "training.")
               .arg(q(r.spec.model.preset))
               .arg(r.spec.model.seed);
  }
  out << QStringLiteral(
      "One prompt and one sampling seed: this shows that and where the batch size changes the "
      "output, not how often it does across prompts and seeds.");
  if (r.provenance.emulated) {
    const auto* profile = ops::find_emulation_profile(r.spec.policy.name);
    out << QStringLiteral(
               "EMULATED: the divergence comes from BatchLens's emulated split-K kernel on the "
               "CPU%1, not from a measurement on a GPU.")
               .arg(profile != nullptr
                        ? QStringLiteral(" (profile `%1`, standing for the %2: %3)")
                              .arg(q(std::string(profile->name)), q(std::string(profile->gpu)),
                                   q(std::string(profile->description)))
                        : QString());
  }
  if (r.spec.mode == experiment::RunMode::Lockstep) {
    out << QStringLiteral(
        "Lockstep mode: every batched run is put back on the reference's canvas each step, so "
        "token changes cannot compound; free mode shows the end-to-end effect.");
  }
  return out;
}

// An HTML excerpt of the changed tokens: the first changes as "position: ref → run".
QString changedTokensHtml(const ExplorerState& state) {
  const auto* r = state.result();
  const auto* c = state.comparison(Side::Before);
  if (r == nullptr || c == nullptr || c->kind != experiment::ComparisonKind::Row0) {
    return {};
  }
  const auto* ref = r->run(c->reference);
  const auto* run = r->run(c->run);
  if (ref == nullptr || run == nullptr) {
    return {};
  }
  const text::Tokenizer* tokenizer = state.document().tokenizer.get();
  const std::vector<ChangedToken> changed = changedTokens(*ref, *run, *c);
  QString html = QStringLiteral("<h3>Changed tokens (%1 of %2)</h3>")
                     .arg(c->tokens_changed)
                     .arg(std::max(ref->tokens.size(), run->tokens.size()));
  if (changed.empty()) {
    return html + QStringLiteral("<p>none: the texts are identical.</p>");
  }
  html += QStringLiteral(
      "<table cellpadding='2'><tr><th align='left'>position</th>"
      "<th align='left'>reference</th><th align='left'>run</th></tr>");
  constexpr std::size_t kShown = 14;
  const auto token = [tokenizer](std::int64_t id) {
    return id < 0 ? QStringLiteral("(none)") : tokenText(tokenizer, id).toHtmlEscaped();
  };
  for (std::size_t i = 0; i < changed.size() && i < kShown; ++i) {
    html += QStringLiteral(
                "<tr><td>%1</td><td style='background:#e0ecf8'>%2</td>"
                "<td style='background:#fde0c5'>%3</td></tr>")
                .arg(changed[i].position)
                .arg(token(changed[i].ref), token(changed[i].run));
  }
  html += QStringLiteral("</table>");
  if (changed.size() > kShown) {
    html += QStringLiteral("<p>… and %1 more</p>").arg(changed.size() - kShown);
  }
  return html;
}

// The story's onset: its first clause that points at a tap in the layer × step view; an empty
// clause (the first tap, nothing framed) when the comparison has none.
analysis::StoryClause onsetClause(const analysis::Story& story) {
  for (const analysis::StoryClause& clause : story.clauses) {
    if (clause.view == analysis::StoryView::LayerStep && !clause.tap.empty()) {
      return clause;
    }
  }
  return {};
}

// What the composite figure shows, for summary.json: the onset heatmap's tap and title.
struct FigureInfo {
  std::string tap;
  QString heatmap_title;
};

// One picture that reads on its own: the headline, the growth plot, the onset heatmap (the
// story's onset tap, whole, whatever tap or zoom the view shows) and the changed tokens, with
// the provenance underneath.
QPixmap compositeFigure(const ExplorerState& state, OverviewView* overview,
                        LayerStepView* layer_step, FigureInfo* info) {
  const QSize size = reportSize();
  QPixmap page(size);
  page.fill(Qt::white);
  const auto* r = state.result();
  if (r == nullptr) {
    return page;
  }
  overview->flush();
  layer_step->flush();
  const analysis::StoryClause onset = onsetClause(overview->story());
  QPainter painter(&page);
  const int margin = 20;
  const int width = size.width() - 2 * margin;
  QTextDocument head;
  head.setTextWidth(width);
  // EMULATED in the title, not only in the footer; and the workaround's outcome beside the
  // headline where the experiment has one (issue #34).
  const QString emulated =
      r->provenance.emulated
          ? QStringLiteral(
                "<div style='font-size:13pt;color:#b00020'><b>EMULATED</b>: a CPU "
                "emulation of GPU split-K, not a GPU measurement</div>")
          : QString();
  QString after;
  if (const auto* a = state.comparison(Side::After)) {
    after = QStringLiteral(
                "<div style='font-size:12pt'><b>With the workaround</b> (%1): text "
                "%2; first divergence %3.</div>")
                .arg((r->spec.workaround ? policyLabel(*r->spec.workaround)
                                         : QStringLiteral("workaround"))
                         .toHtmlEscaped(),
                     a->tokens_identical ? QStringLiteral("identical")
                                         : QStringLiteral("<b>DIFFERS</b>"),
                     q(experiment::describe(a->first)).toHtmlEscaped());
  }
  head.setHtml(
      QStringLiteral("%1<div style='font-size:15pt'>%2</div>%3<div style='color:#444'>%4</div>")
          .arg(emulated, OverviewView::headlineHtml(overview->story(), /*links=*/false), after,
               QString::fromStdString(overview->story().why).toHtmlEscaped()));
  painter.translate(margin, margin);
  head.drawContents(&painter);
  painter.resetTransform();
  const int top = margin + static_cast<int>(head.size().height()) + 10;
  const int footer = 40;
  const int rest = size.height() - top - footer - margin;
  const int growth_h = rest * 2 / 5;
  painter.drawPixmap(margin, top, overview->renderGrowth(QSize(width, growth_h)));
  const int row_top = top + growth_h + 10;
  const int row_h = rest - growth_h - 10;
  const int map_w = width * 3 / 5;
  const QPixmap heatmap = layer_step->renderOnset(QSize(map_w, row_h), onset);
  painter.drawPixmap(margin, row_top, heatmap);
  if (!heatmap.isNull() && !r->taps.empty()) {
    info->tap = r->taps[static_cast<std::size_t>(std::max(tapIndex(*r, onset.tap.c_str()), 0))];
    info->heatmap_title = layer_step->onsetPlot()->title();
  }
  QTextDocument tokens;
  tokens.setTextWidth(width - map_w - 20);
  tokens.setHtml(changedTokensHtml(state));
  painter.translate(margin + map_w + 20, row_top);
  tokens.drawContents(&painter, QRectF(0, 0, width - map_w - 20, row_h));
  painter.resetTransform();
  const auto& p = r->provenance;
  painter.setPen(QColor(0x55, 0x55, 0x55));
  painter.drawText(
      QRect(margin, size.height() - margin - footer, width, footer),
      Qt::AlignLeft | Qt::AlignVCenter,
      QStringLiteral("%1 · %2 (%3) · LibTorch %4 · %5 · policy %6%7 · BatchLens %8 · canvases and "
                     "steps count from 1, layers and positions from 0")
          .arg(q(r->spec.model.describe()), q(p.device), q(p.device_name), q(p.libtorch),
               q(p.dtype), policyLabel(r->spec.policy),
               p.emulated ? QStringLiteral(" (EMULATED)") : QString(), q(p.tool_version)));
  return page;
}

// The prompt in a fence longer than any run of backticks in it, so it cannot close the fence.
QString promptSection(const experiment::ExperimentResult& r) {
  QString md;
  // A fence longer than any run of backticks in the prompt, so the prompt cannot close it.
  const QString prompt = q(r.prompt_text);
  int longest = 0;
  int run = 0;
  for (const QChar ch : prompt) {
    run = ch == QLatin1Char('`') ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  const QString fence(std::max(3, longest + 1), QLatin1Char('`'));
  md += QStringLiteral("## Prompt\n\n%1text\n%2\n%1\n\n").arg(fence, prompt);
  return md;
}

// The tokens that change in a row-0 comparison, at most 60 rows of them.
QString changedTokensSection(const experiment::ExperimentResult& r,
                             const experiment::ComparisonResult* c,
                             const text::Tokenizer* tokenizer) {
  QString md;
  if (c != nullptr && c->kind == experiment::ComparisonKind::Row0) {
    const auto* ref = r.run(c->reference);
    const auto* run = r.run(c->run);
    if (ref != nullptr && run != nullptr) {
      const std::vector<ChangedToken> changed = changedTokens(*ref, *run, *c);
      md +=
          QStringLiteral("## Changed tokens: %1 (`%2`)\n\n").arg(comparisonLabel(r, *c), q(c->id));
      md += QStringLiteral("%1 of %2 generated tokens change; stop position %3 → %4.\n\n")
                .arg(c->tokens_changed)
                .arg(std::max(ref->tokens.size(), run->tokens.size()))
                .arg(ref->stop_position)
                .arg(run->stop_position);
      if (!changed.empty()) {
        constexpr std::size_t kRows = 60;
        md += QStringLiteral("| position | reference | run |\n|---|---|---|\n");
        for (std::size_t i = 0; i < changed.size() && i < kRows; ++i) {
          md +=
              QStringLiteral("| %1 | %2 | %3 |\n")
                  .arg(changed[i].position)
                  .arg(tokenCell(tokenizer, changed[i].ref), tokenCell(tokenizer, changed[i].run));
        }
        if (changed.size() > kRows) {
          md += QStringLiteral("\n… and %1 more (summary.json and the experiment file hold all).\n")
                    .arg(changed.size() - kRows);
        }
        md += QStringLiteral("\n");
      }
    }
  }
  return md;
}

// Where the comparison first differs, with its metrics there, and the workaround's side.
QString firstDivergenceSection(const ExplorerState& state, const experiment::ExperimentResult& r,
                               const experiment::ComparisonResult* c) {
  QString md;
  if (c != nullptr) {
    md += QStringLiteral("## First divergence\n\n%1").arg(q(experiment::describe(c->first)));
    if (c->first.found()) {
      const int slot = c->first.layer >= 0 ? c->first.layer : r.layers;
      const int tap = tapIndex(r, c->first.tap.c_str());
      if (tap >= 0) {
        md += QStringLiteral(": share differing %1, max |Δ| %2, max ULP %3")
                  .arg(formatValue(cellValue(*c, Metric::FracDiffer, c->first.tick, slot, tap)),
                       formatValue(cellValue(*c, Metric::MaxAbs, c->first.tick, slot, tap)),
                       formatValue(cellValue(*c, Metric::MaxUlp, c->first.tick, slot, tap)));
      }
    }
    md += QStringLiteral(".\n\n");
    if (const experiment::ExactAtDivergence* e = r.exact ? r.exact->find(c->id) : nullptr) {
      md += QStringLiteral(
          "Exact reference (fp64 on the CPU, from B=1's operands at that step):\n\n");
      for (const std::string& line : experiment::exact_lines(*e)) {
        md += QStringLiteral("- %1\n").arg(q(line));
      }
      md += QLatin1Char('\n');
    }
    if (const auto* after = state.comparison(Side::After)) {
      md += QStringLiteral("With the workaround (`%1`): first divergence %2; text %3.\n\n")
                .arg(q(after->id), q(experiment::describe(after->first)),
                     after->tokens_identical ? QStringLiteral("identical")
                                             : QStringLiteral("DIFFERS"));
    }
  }
  return md;
}

// The culprit finder's result: the fix, how it was searched, what it costs (with the spread
// of the passes), as `batchlens-cli summary` prints it (issue #34: summary.md left it out).
QString culpritSection(const experiment::ExperimentResult& r) {
  if (!r.culprit) {
    return {};
  }
  const experiment::CulpritReport& c = *r.culprit;
  const std::vector<int> sizes(r.spec.batch_sizes.begin(), r.spec.batch_sizes.end());
  QString md = QStringLiteral("## Culprit\n\n**%1**\n\n").arg(q(c.headline(sizes)));
  md += QStringLiteral("Strategy %1; %2 trials in %3 s; %4\n\n")
            .arg(q(std::string(ops::strategy_name(c.strategy))))
            .arg(c.trials.size())
            .arg(c.wall_s, 0, 'f', 1)
            .arg(q(c.verdict));
  if (c.found) {
    md += QStringLiteral("Fix: `%1`\n\n").arg(q(ops::describe(c.fix)));
  }
  for (const experiment::CulpritCost& k : c.costs) {
    md += QStringLiteral("- cost at B=%1: %2\n").arg(k.batch_size).arg(q(k.detail()));
  }
  return c.costs.empty() ? md : md + QStringLiteral("\n");
}

// The kernels behind the first divergence at B=1 and B=N (kernel provenance), as the summary
// prints them.
QString kernelsSection(const experiment::ExperimentResult& r,
                       const experiment::ComparisonResult* c) {
  if (c == nullptr || c->kind != experiment::ComparisonKind::Row0) {
    return {};
  }
  const std::vector<std::string> lines = analysis::first_divergence_kernels(r, *c);
  if (lines.empty()) {
    return {};
  }
  QString md = QStringLiteral("## Kernels at the first divergence\n\n```\n");
  for (const std::string& line : lines) {
    md += q(line) + QLatin1Char('\n');
  }
  return md + QStringLiteral("```\n\n");
}

// The noise floor and the table of every comparison.
QString comparisonsSection(const experiment::ExperimentResult& r) {
  QString md;
  md += QStringLiteral("## Noise floor\n\n");
  if (const auto* floor = r.comparison(experiment::noise_floor_comparison())) {
    md += floor->first.found()
              ? QStringLiteral("NOT clean: the B=1 repeat already differs (%1).\n\n")
                    .arg(q(experiment::describe(floor->first)))
              : QStringLiteral(
                    "Clean: the B=1 repeat is bitwise identical to the reference at "
                    "every step and tap.\n\n");
  } else {
    md += QStringLiteral("Not measured (no B=1 repeat in this experiment).\n\n");
  }
  md += QStringLiteral(
      "## Comparisons\n\n| comparison | id | text | tokens changed | stop | "
      "steps | first divergence | positions differing (last step) | token "
      "scores differing (last step) |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& k : r.comparisons) {
    const auto last = experiment::last_step_logit_diff(r, k);
    const bool rows = k.kind == experiment::ComparisonKind::Rows;
    const auto* kref = r.run(k.reference);
    const auto* krun = r.run(k.run);
    const std::size_t total =
        kref != nullptr && krun != nullptr ? std::max(kref->tokens.size(), krun->tokens.size()) : 0;
    md += QStringLiteral("| %1 | `%2` | %3 | %4 | %5 | %6 | %7 | %8 | %9 |\n")
              .arg(cell(comparisonLabel(r, k)), q(k.id),
                   rows ? QStringLiteral("-")
                        : yesNo(!k.tokens_identical, QStringLiteral("**DIFFERS**"),
                                QStringLiteral("identical")),
                   rows ? QStringLiteral("-")
                        : QStringLiteral("%1 of %2").arg(k.tokens_changed).arg(total),
                   rows ? QStringLiteral("-")
                        : yesNo(k.stop_changed, QStringLiteral("**changed**"),
                                QStringLiteral("unchanged")),
                   rows ? QStringLiteral("-")
                        : yesNo(k.steps_changed, QStringLiteral("**changed**"),
                                QStringLiteral("unchanged")),
                   cell(q(experiment::describe(k.first))),
                   rows ? QStringLiteral("-")
                        : QStringLiteral("%1 %").arg(100 * last.positions, 0, 'g', 4),
                   rows ? QStringLiteral("-")
                        : QStringLiteral("%1 %").arg(100 * last.scores, 0, 'g', 4));
  }
  return md;
}

// Where and with what the experiment ran.
QString environmentSection(const experiment::ExperimentResult& r) {
  QString md;
  const auto& p = r.provenance;
  md += QStringLiteral("\n## Environment\n\n");
  md += QStringLiteral("- Device: %1 (%2); driver %3, CUDA %4, cuBLAS %5\n")
            .arg(q(p.device), q(p.device_name), q(p.driver.empty() ? "-" : p.driver),
                 q(p.cuda.empty() ? "-" : p.cuda), q(p.cublas.empty() ? "-" : p.cublas));
  md += QStringLiteral("- LibTorch %1 (%2), %3, experts %4, %5 threads\n")
            .arg(q(p.libtorch), q(p.blas), q(p.dtype), q(r.spec.load.experts))
            .arg(p.threads);
  md += QStringLiteral("- Policy: %1; workaround: %2\n")
            .arg(q(ops::describe(r.spec.policy)),
                 r.spec.workaround ? q(ops::describe(*r.spec.workaround)) : QStringLiteral("none"));
  if (r.spec.composition.mixed() || r.spec.composition.row != 0) {
    md += QStringLiteral("- Batch rows: %1\n").arg(q(experiment::describe(r.spec.composition)));
    if (r.causes) {
      md += QStringLiteral("- Row under test: %1\n").arg(q(r.causes->layout_text()));
      if (!r.causes->verdict.empty()) {
        md += QStringLiteral("- Causes: %1\n").arg(q(r.causes->verdict));
      }
    }
  }
  md += QStringLiteral("- Mode %1, rng %2, prefill %3, seed %4; %5 layers, canvas %6\n")
            .arg(QString::fromLatin1(experiment::name(r.spec.mode)),
                 QString::fromLatin1(generation::name(r.spec.rng)),
                 QString::fromLatin1(generation::name(r.spec.prefill)))
            .arg(r.spec.seed)
            .arg(r.layers)
            .arg(r.canvas_length);
  md +=
      QStringLiteral("- Recorded %1 on %2 with BatchLens %3; report by BatchLens %4\n")
          .arg(q(p.created_utc), q(p.host), q(p.tool_version), q(base::build_info().tool_version));
  md += QStringLiteral(
      "- Numbering: canvases and denoising steps count from 1; layers and "
      "canvas positions are indices from 0 (as in `model.layers.0`).\n");
  return md;
}

}  // namespace

QString reportMarkdown(const ExplorerState& state, const QStringList& images) {
  const auto* r = state.result();
  if (r == nullptr) {
    return {};
  }
  const auto& p = r->provenance;
  const auto* c = state.comparison(Side::Before);
  const text::Tokenizer* tokenizer = state.document().tokenizer.get();
  QString md;
  md += QStringLiteral("# BatchLens report: %1\n\n").arg(q(r->spec.model.describe()));
  const analysis::Story story =
      analysis::build_story(*r, c != nullptr ? c->id : analysis::headline_comparison(*r));
  if (!story.clauses.empty()) {
    md += QStringLiteral("**%1%2**\n\n")
              .arg(p.emulated ? QStringLiteral("EMULATED (a CPU emulation of GPU split-K): ")
                              : QString(),
                   q(story.headline()));
  }
  if (!story.why.empty()) {
    md += q(story.why) + QStringLiteral("\n\n");
  }
  if (p.emulated) {
    md += QStringLiteral(
        "> **EMULATED**: some runs used the emulated split-K kernel (a CPU emulation of GPU "
        "libraries choosing the reduction split by batch shape). Not a GPU measurement.\n\n");
  }
  for (const QString& image : images) {
    if (QFileInfo(image).baseName() == QStringLiteral("figure")) {
      md += QStringLiteral("![Growth, onset and changed tokens](figure.png)\n\n");
    }
  }
  md += promptSection(*r);
  md += changedTokensSection(*r, c, tokenizer);
  md += firstDivergenceSection(state, *r, c);
  md += kernelsSection(*r, c);
  md += culpritSection(*r);
  md += comparisonsSection(*r);
  md += environmentSection(*r);
  md += QStringLiteral("\n## Caveats\n\n");
  for (const QString& caveat : caveats(*r)) {
    md += QStringLiteral("- %1\n").arg(caveat);
  }
  md += QStringLiteral("\n## Reproduce\n\n```sh\n%1\nbatchlens-cli summary experiment.h5\n```\n\n")
            .arg(q(experiment::cli_run_command(r->spec, {}, "experiment.h5")));
  if (!images.isEmpty()) {
    md += QStringLiteral("## Views\n\n");
    md += QStringLiteral(
        "> The images are files beside this summary, not part of it: attach the PNG files of "
        "this folder when you send it.\n\n");
    for (const QString& image : images) {
      md += QStringLiteral("![%1](%2)\n\n")
                .arg(QFileInfo(image).baseName(), QFileInfo(image).fileName());
    }
  }
  return md;
}

base::Result<void> checkReportFolder(const QString& dir) {
  const QFileInfo info(dir);
  if (!info.exists() && !info.isSymLink()) {
    return {};
  }
  if (!info.isDir()) {
    return base::Error{base::ErrorCode::InvalidArgument,
                       "the report folder " + dir.toStdString() +
                           " exists and is not a folder: give a new or empty folder"};
  }
  if (!QDir(dir).isEmpty(QDir::AllEntries | QDir::Hidden | QDir::System | QDir::NoDotAndDotDot)) {
    return base::Error{base::ErrorCode::InvalidArgument,
                       "the report folder " + dir.toStdString() +
                           " exists and is not empty: give a new or empty folder (nothing was "
                           "written)"};
  }
  return {};
}

QString newReportFolder(const QString& parent, const ExplorerState& state) {
  QString comparison = state.comparisonId();
  // The id is the file's text: keep only what is safe in a file name everywhere.
  for (QChar& ch : comparison) {
    if (!ch.isLetterOrNumber() && ch != QLatin1Char('_') && ch != QLatin1Char('.') &&
        ch != QLatin1Char('-')) {
      ch = QLatin1Char('_');
    }
  }
  QString stem = QStringLiteral("batchlens-report");
  if (!comparison.isEmpty()) {
    stem += QLatin1Char('-') + comparison.left(64);
  }
  stem +=
      QLatin1Char('-') + QDateTime::currentDateTime().toString(QStringLiteral("yyyyMMdd-HHmmss"));
  const QDir base(parent);
  QString candidate = base.filePath(stem);
  for (int n = 2; QFileInfo::exists(candidate) || QFileInfo(candidate).isSymLink(); ++n) {
    candidate = base.filePath(QStringLiteral("%1-%2").arg(stem).arg(n));
  }
  return candidate;
}

base::Result<QStringList> exportReport(const QString& dir, const ExplorerState& state,
                                       const std::vector<ReportView>& views) {
  const auto* r = state.result();
  if (r == nullptr) {
    return base::Error{base::ErrorCode::InvalidArgument, "no experiment to export"};
  }
  // "out/report/" and "out/report" are the same folder; the temporary goes beside it.
  const QString target = QDir::cleanPath(QFileInfo(dir).absoluteFilePath());
  if (auto ok = checkReportFolder(target); !ok.ok()) {
    return ok.error();
  }
  for (const auto& c : r->comparisons) {
    if (!experiment::last_step_logit_diff(*r, c).readable) {
      return base::Error{base::ErrorCode::FileCorrupted,
                         "comparison " + c.id + ": its arrays do not fit their shapes"};
    }
  }
  const QString parent = QFileInfo(target).absolutePath();
  if (!QDir().mkpath(parent)) {
    return base::Error{base::ErrorCode::IoFailed,
                       "cannot create the folder " + parent.toStdString()};
  }
  // Rendered first: nothing touches the disk until every page exists.
  std::vector<std::pair<QString, QPixmap>> pages;
  OverviewView* overview = nullptr;
  LayerStepView* layer_step = nullptr;
  for (const auto& [stem, view] : views) {
    overview = overview != nullptr ? overview : qobject_cast<OverviewView*>(view);
    layer_step = layer_step != nullptr ? layer_step : qobject_cast<LayerStepView*>(view);
  }
  FigureInfo figure;
  if (overview != nullptr && layer_step != nullptr) {
    pages.emplace_back(QStringLiteral("figure"),
                       compositeFigure(state, overview, layer_step, &figure));
  }
  for (const auto& [stem, view] : views) {
    pages.emplace_back(stem, view->renderReport(reportSize()));
  }
  std::vector<std::pair<QString, QByteArray>> files;
  QStringList images;
  for (const auto& [stem, page] : pages) {
    QByteArray png;
    QBuffer buffer(&png);
    buffer.open(QIODevice::WriteOnly);
    if (page.isNull() || !page.save(&buffer, "PNG")) {
      return base::Error{base::ErrorCode::IoFailed, "could not render " + stem.toStdString()};
    }
    files.emplace_back(stem + QStringLiteral(".png"), std::move(png));
    images << QDir(target).filePath(stem + QStringLiteral(".png"));
  }
  auto built = base::guarded([&] {
    nlohmann::json summary = analysis::summary_json(*r);
    summary["selected_comparison"] = state.comparisonId().toStdString();
    summary["tool_version"] = base::build_info().tool_version;
    summary["provenance"] = {{"created_utc", r->provenance.created_utc},
                             {"host", r->provenance.host},
                             {"driver", r->provenance.driver},
                             {"cuda", r->provenance.cuda},
                             {"cublas", r->provenance.cublas},
                             {"dtype", r->provenance.dtype},
                             {"blas", r->provenance.blas}};
    summary["spec"] = experiment::to_json(r->spec);
    summary["reproduce"] = experiment::cli_run_command(r->spec, {}, "experiment.h5");
    if (const auto* c = state.comparison(Side::Before)) {
      const auto* ref = r->run(c->reference);
      const auto* run = r->run(c->run);
      nlohmann::json changed = nlohmann::json::array();
      if (ref != nullptr && run != nullptr && c->kind == experiment::ComparisonKind::Row0) {
        for (const ChangedToken& t : changedTokens(*ref, *run, *c)) {
          changed.push_back({{"position", t.position}, {"reference", t.ref}, {"run", t.run}});
        }
      }
      summary["changed_tokens"] = {{"comparison", c->id}, {"tokens", changed}};
    }
    nlohmann::json image_names = nlohmann::json::array();
    for (const QString& image : images) {
      image_names.push_back(QFileInfo(image).fileName().toStdString());
    }
    summary["images"] = image_names;
    if (overview != nullptr && layer_step != nullptr) {
      summary["figure"] = {{"onset_tap", figure.tap},
                           {"heatmap_title", figure.heatmap_title.toStdString()}};
    }
    // A run's text or the prompt may hold bytes that are not UTF-8 (byte-fallback tokens).
    const std::string json = base::dump_json_lossy(summary, 2) + "\n";
    return QByteArray(json.data(), static_cast<qsizetype>(json.size()));
  });
  if (!built.ok()) {
    return built.error();
  }
  files.emplace_back(QStringLiteral("summary.json"), std::move(built).value());
  files.emplace_back(QStringLiteral("summary.md"), reportMarkdown(state, images).toUtf8());

  return base::guarded([&]() -> base::Result<QStringList> {
    base::AtomicDir folder(localPath(target));
    QStringList written;
    for (const auto& [name, bytes] : files) {
      if (auto ok = writeBytes(folder.path() / localPath(name), bytes); !ok.ok()) {
        return ok.error();
      }
      written << QDir(target).filePath(name);
    }
    folder.commit();
    return written;
  });
}

base::Result<QStringList> exportSweepReport(const QString& dir, SweepView& view) {
  const auto& sweep = view.document().sweep;
  if (sweep == nullptr) {
    return base::Error{base::ErrorCode::InvalidArgument, "no sweep to export"};
  }
  const QString target = QDir::cleanPath(QFileInfo(dir).absoluteFilePath());
  if (auto ok = checkReportFolder(target); !ok.ok()) {
    return ok.error();
  }
  const QString parent = QFileInfo(target).absolutePath();
  if (!QDir().mkpath(parent)) {
    return base::Error{base::ErrorCode::IoFailed,
                       "cannot create the folder " + parent.toStdString()};
  }
  QByteArray png;
  QBuffer buffer(&png);
  buffer.open(QIODevice::WriteOnly);
  if (const QPixmap page = view.renderReport(reportSize());
      page.isNull() || !page.save(&buffer, "PNG")) {
    return base::Error{base::ErrorCode::IoFailed, "could not render the sweep view"};
  }
  auto texts = base::guarded([&] {
    nlohmann::json summary = analysis::sweep_json(*sweep);
    summary["tool_version"] = base::build_info().tool_version;
    summary["images"] = nlohmann::json::array({"sweep.png"});
    const std::string md = "# BatchLens sweep report: " + sweep->id +
                           "\n\n![sweep](sweep.png)\n\n" + "```text\n" +
                           analysis::sweep_text(*sweep) + "```\n";
    return std::make_pair(base::dump_json_lossy(summary, 2) + "\n", md);
  });
  if (!texts.ok()) {
    return texts.error();
  }
  const std::vector<std::pair<QString, std::string>> files{
      {QStringLiteral("sweep.png"),
       std::string(png.constData(), static_cast<std::size_t>(png.size()))},
      {QStringLiteral("summary.md"), texts.value().second},
      {QStringLiteral("summary.json"), texts.value().first}};
  return base::guarded([&]() -> base::Result<QStringList> {
    base::AtomicDir folder(localPath(target));
    QStringList written;
    for (const auto& [name, bytes] : files) {
      if (auto ok = base::write_file_atomic(folder.path() / localPath(name), bytes); !ok.ok()) {
        return ok.error();
      }
      written << QDir(target).filePath(name);
    }
    folder.commit();
    return written;
  });
}

}  // namespace batchlens::ui
