// SPDX-License-Identifier: Apache-2.0
// `batchlens-cli sweep-merge`: shard files of one sweep into one sweep file (issue #19), the
// merge job of a Slurm fan-out or by hand (core/experiment/sweep.h: merge_sweeps).
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "app/cli/command.h"
#include "app/cli/model_options.h"
#include "core/analysis/sweep_merge.h"
#include "core/analysis/sweep_records.h"
#include "core/analysis/sweep_report.h"
#include "core/analysis/sweep_spec.h"
#include "core/io/sweep_file.h"

namespace batchlens::cli {

void register_sweep_merge(CLI::App& app, int& exit_code) {
  struct Options {
    std::vector<std::string> parts;
    std::string out;
    bool partial = false;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "sweep-merge",
      "Merge the shard files of one sweep (DIR/shards/shard-I-of-N.h5, also merged files or "
      "sweep folders) into one sweep file. Refuses parts of another sweep (its id and spec are "
      "stored in each), an item that differs between parts and a shard given twice; with items "
      "missing it writes nothing unless --allow-partial");
  cmd->add_option("parts", opts->parts, "Shard files, sweep files or sweep folders")->required();
  cmd->add_option("--out", opts->out, "Sweep file to write (.h5)")->required();
  cmd->add_flag("--allow-partial", opts->partial,
                "Write the merged file even when items are missing (a shard failed)");
  cmd->footer(kExitCodesHelp);
  cmd->callback([opts, &exit_code] {
    std::vector<analysis::SweepRecords> parts;
    for (const std::string& p : opts->parts) {
      auto part = io::read_sweep(p);
      if (!part.ok()) {
        exit_code = report_error(part.error());
        return;
      }
      parts.push_back(std::move(part).value());
    }
    auto merged = analysis::merge_sweeps(parts, opts->parts);
    if (!merged.ok()) {
      exit_code = report_error(merged.error());
      return;
    }
    const std::vector<int> missing = analysis::missing_items(merged.value());
    if (!missing.empty()) {
      std::cerr << "batchlens-cli sweep-merge: " << missing.size() << " of "
                << merged.value().items_total << " items have no rows (first: item "
                << missing.front() << ")"
                << (opts->partial ? "; writing the partial file as asked\n"
                                  : "; re-run the failed shard(s) (sbatch --array=I "
                                    "sweep-array.sbatch) or pass --allow-partial\n");
      if (!opts->partial) {
        exit_code = kExitFailure;
        return;
      }
    }
    if (auto w = io::write_sweep_file(opts->out, merged.value()); !w.ok()) {
      exit_code = report_error(w.error());
      return;
    }
    std::cout << analysis::sweep_text(merged.value()) << "\nmerged " << parts.size()
              << " part(s) into " << opts->out << "\n";
    exit_code = kExitOk;
  });
}

}  // namespace batchlens::cli
