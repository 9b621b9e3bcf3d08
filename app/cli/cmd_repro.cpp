// SPDX-License-Identifier: Apache-2.0
// `batchlens-cli repro`: the minimal repro export of issue #18 (core/experiment/repro.h).
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "app/cli/cli_progress.h"
#include "app/cli/command.h"
#include "app/cli/model_options.h"
#include "core/analysis/repro.h"
#include "core/io/experiment_file.h"

namespace batchlens::cli {

namespace {

// "64MiB", "512KiB", "2GiB", "1000000" (bytes); false for anything else.
bool parse_bytes(const std::string& text, std::uint64_t& out) {
  std::size_t used = 0;
  unsigned long long n = 0;
  try {
    n = std::stoull(text, &used);
  } catch (const std::exception&) {
    return false;
  }
  const std::string unit = text.substr(used);
  int shift = 0;
  if (unit == "KiB" || unit == "K") {
    shift = 10;
  } else if (unit == "MiB" || unit == "M") {
    shift = 20;
  } else if (unit == "GiB" || unit == "G") {
    shift = 30;
  } else if (!unit.empty() && unit != "B") {
    return false;
  }
  if (n > (std::uint64_t{1} << (62 - shift))) {
    return false;
  }
  out = static_cast<std::uint64_t>(n) << shift;
  return true;
}

}  // namespace

void register_repro(CLI::App& app, int& exit_code) {
  struct Options {
    std::string file;
    std::string comparison;
    std::string op;
    int layer = -1;
    int canvas = 1;
    int step = -1;
    std::string out;
    std::string max_bytes = "64MiB";
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "repro",
      "Export a minimal repro of one op of an experiment: its row-0 inputs captured from the B=1 "
      "reference at the step where it diverged (the model is loaded again as the file names "
      "it), and a folder a maintainer runs with plain PyTorch: repro.py (batch 1 vs the row "
      "repeated to B; exit 1 when row 0 differs), inputs.safetensors, op.json, README.md. "
      "Default: the first op behind the first divergence of the first comparison that diverges "
      "that reproduces alone.");
  cmd->add_option("file", opts->file, "Experiment file (.h5)")->required();
  cmd->add_option("--comparison", opts->comparison,
                  "Row-0 comparison id, e.g. ref__b4 (default: the first that diverges)");
  cmd->add_option("--op", opts->op,
                  "Op family, e.g. selfcond_matmul, q_proj (default: the ops "
                  "behind the divergence's tap)");
  cmd->add_option("--layer", opts->layer, "Layer of a per-layer --op");
  cmd->add_option("--step", opts->step,
                  "Denoising step (1-based) within --canvas (default: the first divergence's)");
  cmd->add_option("--canvas", opts->canvas, "Canvas (1-based) of --step")->capture_default_str();
  cmd->add_option("--out", opts->out, "Folder to write (a previous repro there is replaced)")
      ->required();
  cmd->add_option("--max-bytes", opts->max_bytes,
                  "Cap on inputs.safetensors: operands beyond it are named by checkpoint key "
                  "and sha256 and the script draws seeded random stand-ins (B, KiB, MiB, GiB)")
      ->capture_default_str();
  cmd->footer(kExitCodesHelp);
  cmd->callback([opts, &exit_code] {
    analysis::ReproRequest req;
    if (!parse_bytes(opts->max_bytes, req.max_bytes)) {
      std::cerr << "batchlens-cli repro: --max-bytes '" << opts->max_bytes
                << "' is not a size (e.g. 64MiB, 512KiB, 1000000)\n";
      exit_code = kExitUsage;
      return;
    }
    if (opts->step == 0 || opts->step < -1 || opts->canvas < 1) {
      std::cerr << "batchlens-cli repro: --step and --canvas count from 1\n";
      exit_code = kExitUsage;
      return;
    }
    if (opts->layer >= 0 && opts->op.empty()) {
      std::cerr << "batchlens-cli repro: --layer needs --op\n";
      exit_code = kExitUsage;
      return;
    }
    req.comparison = opts->comparison;
    req.family = opts->op;
    req.layer = opts->layer;
    req.step = opts->step;
    req.canvas = opts->step > 0 ? opts->canvas - 1 : -1;
    req.out = opts->out;
    req.source_file = opts->file;
    const auto shown = io::read_experiment(opts->file);
    if (!shown.ok()) {
      exit_code = report_error(shown.error());
      return;
    }
    base::Result<analysis::ReproExport> r = base::Error{};
    {
      const SigintCancel sigint;
      experiment::RunControl control;
      control.cancel = sigint.token();
      control.progress = draw_progress;
      control.load_progress = draw_progress;
      r = analysis::export_repro(shown.value(), req, control);
    }
    std::fprintf(stderr, "\n");
    if (!r.ok()) {
      exit_code = report_error(r.error());
      return;
    }
    std::cout << analysis::repro_text(r.value());
    exit_code = kExitOk;
  });
}

}  // namespace batchlens::cli
