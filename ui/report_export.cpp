// SPDX-License-Identifier: Apache-2.0
#include "ui/report_export.h"

#include <filesystem>
#include <string>

#include <QBuffer>
#include <QDateTime>
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QPixmap>

#include "core/base/atomic_file.h"
#include "core/base/input.h"
#include "core/base/version.h"
#include "ui/report_render.h"
#include "ui/views.h"

namespace batchlens::ui {

namespace {

QString q(const std::string& s) {
  return QString::fromStdString(s);
}

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

QString reportMarkdown(const ExplorerState& state, const QStringList& images) {
  const auto* r = state.result();
  if (r == nullptr) {
    return {};
  }
  const auto& p = r->provenance;
  QString md;
  md += QStringLiteral("# BatchLens report: %1\n\n").arg(q(r->spec.model.describe()));
  if (p.emulated) {
    md += QStringLiteral(
        "> **EMULATED**: some runs used the emulated split-K kernel (a CPU emulation of GPU "
        "libraries choosing the reduction split by batch shape). Not a GPU measurement.\n\n");
  }
  md += QStringLiteral("- Device: %1 (%2); driver %3, CUDA %4, cuBLAS %5\n")
            .arg(q(p.device), q(p.device_name), q(p.driver.empty() ? "-" : p.driver),
                 q(p.cuda.empty() ? "-" : p.cuda), q(p.cublas.empty() ? "-" : p.cublas));
  md += QStringLiteral("- LibTorch %1 (%2), %3, experts %4\n")
            .arg(q(p.libtorch), q(p.blas), q(p.dtype), q(r->spec.load.experts));
  md += QStringLiteral("- Policy: %1; workaround: %2\n")
            .arg(q(ops::policy_text(r->spec.policy)), r->spec.workaround
                                                          ? q(ops::policy_text(*r->spec.workaround))
                                                          : QStringLiteral("none"));
  md += QStringLiteral("- Mode %1, rng %2, prefill %3, seed %4; %5 layers, canvas %6\n")
            .arg(QString::fromLatin1(experiment::name(r->spec.mode)),
                 QString::fromLatin1(generation::name(r->spec.rng)),
                 QString::fromLatin1(generation::name(r->spec.prefill)))
            .arg(r->spec.seed)
            .arg(r->layers)
            .arg(r->canvas_length);
  md +=
      QStringLiteral("- Recorded %1 on %2 with BatchLens %3; report by BatchLens %4\n")
          .arg(q(p.created_utc), q(p.host), q(p.tool_version), q(base::build_info().tool_version));
  if (const auto* floor = r->comparison("ref__repeat1")) {
    md += QStringLiteral("- Noise floor (B=1 repeat): %1\n")
              .arg(floor->first.found()
                       ? QStringLiteral("NOT clean (%1)").arg(q(experiment::describe(floor->first)))
                       : QStringLiteral("clean, bitwise identical"));
  }
  md += QStringLiteral(
      "\n## Comparisons\n\n| comparison | id | text | tokens changed | stop | "
      "steps | first divergence | positions differing (last step) | token "
      "scores differing (last step) |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& c : r->comparisons) {
    const auto last = experiment::last_step_logit_diff(*r, c);
    const bool rows = c.kind == "rows";
    md += QStringLiteral("| %1 | `%2` | %3 | %4 | %5 | %6 | %7 | %8 | %9 |\n")
              .arg(cell(comparisonLabel(*r, c)), q(c.id),
                   rows ? QStringLiteral("-")
                        : yesNo(!c.tokens_identical, QStringLiteral("**DIFFERS**"),
                                QStringLiteral("identical")),
                   rows ? QStringLiteral("-") : QString::number(c.tokens_changed),
                   rows ? QStringLiteral("-")
                        : yesNo(c.stop_changed, QStringLiteral("**changed**"),
                                QStringLiteral("unchanged")),
                   rows ? QStringLiteral("-")
                        : yesNo(c.steps_changed, QStringLiteral("**changed**"),
                                QStringLiteral("unchanged")),
                   cell(q(experiment::describe(c.first))),
                   rows ? QStringLiteral("-")
                        : QStringLiteral("%1 %").arg(100 * last.positions, 0, 'g', 4),
                   rows ? QStringLiteral("-")
                        : QStringLiteral("%1 %").arg(100 * last.scores, 0, 'g', 4));
  }
  if (const auto* c = state.comparison(Side::Before)) {
    md += QStringLiteral("\n## Selected comparison: %1 (`%2`)\n\n")
              .arg(comparisonLabel(*r, *c), q(c->id));
    md += QStringLiteral("First divergence: %1.\n\n").arg(q(experiment::describe(c->first)));
    md += QStringLiteral("View: tap `%1`, metric %2%3, selected %4, layer slot %5.\n\n")
              .arg(state.tapNames().value(state.tap()), metricLabel(state.metric()),
                   state.logScale() ? QStringLiteral(" (log)") : QString(),
                   state.tickLabel(state.tick()))
              .arg(state.layerSlot());
    if (const auto* after = state.comparison(Side::After)) {
      md += QStringLiteral("With the workaround (`%1`): first divergence %2; text %3.\n\n")
                .arg(q(after->id), q(experiment::describe(after->first)),
                     after->tokens_identical ? QStringLiteral("identical")
                                             : QStringLiteral("DIFFERS"));
    }
    const auto* ref = r->run(c->reference);
    const auto* run = r->run(c->run);
    if (ref != nullptr && run != nullptr) {
      md += QStringLiteral("Reference text (`%1`, stop %2):\n\n```\n%3\n```\n\n")
                .arg(q(ref->id))
                .arg(ref->stop_position)
                .arg(q(ref->text));
      md += QStringLiteral("Run text (`%1`, stop %2):\n\n```\n%3\n```\n\n")
                .arg(q(run->id))
                .arg(run->stop_position)
                .arg(q(run->text));
    }
  }
  if (!images.isEmpty()) {
    md += QStringLiteral("## Views\n\n");
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
  std::vector<std::pair<QString, QByteArray>> files;
  QStringList images;
  for (const auto& [stem, view] : views) {
    const QPixmap page = view->renderReport(reportSize());
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
    nlohmann::json summary = experiment::summary_json(*r);
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
    nlohmann::json image_names = nlohmann::json::array();
    for (const QString& image : images) {
      image_names.push_back(QFileInfo(image).fileName().toStdString());
    }
    summary["images"] = image_names;
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

}  // namespace batchlens::ui
