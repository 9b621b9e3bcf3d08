// SPDX-License-Identifier: Apache-2.0
#include <filesystem>
#include <iostream>
#include <memory>

#include "app/cli/cli_progress.h"
#include "app/cli/command.h"
#include "app/cli/model_options.h"
#include "core/analysis/kernel_evidence.h"
#include "core/analysis/summary.h"
#include "core/analysis/sweep_records.h"
#include "core/analysis/sweep_report.h"
#include "core/base/input.h"
#include "core/io/experiment_file.h"
#include "core/io/sweep_file.h"

namespace batchlens::cli {

void register_summary(CLI::App& app, int& exit_code) {
  struct Options {
    std::string file;
    bool json = false;
    bool kernels = false;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "summary",
      "Summarise an experiment file, a sweep file or a sweep folder (batchlens-cli sweep)");
  cmd->add_option("file", opts->file, "Experiment file (.h5), sweep file (.h5) or sweep folder")
      ->required();
  cmd->add_flag("--json", opts->json, "Print JSON");
  cmd->add_flag("--kernels", opts->kernels,
                "Also list, per engine, every op whose kernels differ from the B=1 "
                "reference's (the file's kernel provenance)");
  cmd->callback([opts, &exit_code] {
    // A sweep's folder or file.
    std::error_code ec;
    if (std::filesystem::is_directory(opts->file, ec) || io::is_sweep_file(opts->file)) {
      const auto s = io::read_sweep(opts->file);
      if (!s.ok()) {
        exit_code = report_error(s.error());
        return;
      }
      std::cout << (opts->json ? base::dump_json_lossy(analysis::sweep_json(s.value()), 2) + "\n"
                               : analysis::sweep_text(s.value()));
      exit_code = kExitOk;
      return;
    }
    const auto r = io::read_experiment(opts->file);
    if (!r.ok()) {
      exit_code = report_error(r.error());
      return;
    }
    std::cout << (opts->json ? base::dump_json_lossy(analysis::summary_json(r.value()), 2) + "\n"
                             : analysis::summary_text(r.value()));
    if (opts->kernels && !opts->json) {
      std::cout << "\n" << analysis::kernels_text(r.value());
    }
    exit_code = kExitOk;
  });
}

}  // namespace batchlens::cli
