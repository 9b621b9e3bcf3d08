// SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <iostream>
#include <memory>

#include "app/cli/command.h"
#include "app/cli/spec_options.h"
#include "core/analysis/culprit.h"
#include "core/experiment/experiment.h"
#include "core/experiment/runner.h"

namespace batchlens::cli {

void register_culprit(CLI::App& app, int& exit_code) {
  struct Options {
    SpecOptions spec;
    std::string strategy = "row_wise";
    int cost_repeats = 5;
    bool free_trials = false;
    bool no_narrow = false;
    bool plain_search = false;
    std::int64_t horizon_ticks = -1;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "culprit",
      "Find the op families that, at least, must change for row 0 of every batch size to be "
      "bitwise B=1's: greedy from the first divergence, 1-minimal, layer ranges narrowed, "
      "confirmed in free mode; then measure the fix's cost. Writes one experiment file: the "
      "spec with the fix as its workaround, and the finder's trials");
  add_spec_options(cmd, opts->spec, /*workaround=*/false);
  cmd->add_option("--strategy", opts->strategy,
                  "How the culprit families are fixed: row_wise or batch_invariant")
      ->capture_default_str();
  cmd->add_option("--cost-repeats", opts->cost_repeats,
                  "Decoder passes timed per batch size, without and with the fix (0: no costs)")
      ->capture_default_str();
  cmd->add_flag("--free-trials", opts->free_trials,
                "Search and minimise in free mode too (slower; lockstep by default)");
  cmd->add_flag("--no-narrow", opts->no_narrow, "Keep each family's fix on every layer");
  cmd->add_flag("--plain-search", opts->plain_search,
                "Minimise one family at a time and narrow layer ranges by plain binary search "
                "(the same answer in more trials; to compare)");
  cmd->add_option("--horizon-ticks", opts->horizon_ticks,
                  "Ticks each search/minimise/narrow trial watches: -1 chosen from where the "
                  "trials diverged (none with --plain-search), 0 every tick, N the first N; the "
                  "answer is verified on the whole generation either way")
      ->check(CLI::Range(std::int64_t{-1}, std::int64_t{1} << 30))
      ->capture_default_str();
  cmd->callback([opts, &exit_code] {
    analysis::CulpritOptions co;
    if (opts->strategy == "row_wise") {
      co.strategy = ops::Strategy::RowWise;
    } else if (opts->strategy == "batch_invariant") {
      co.strategy = ops::Strategy::BatchInvariant;
    } else {
      std::cerr << "batchlens-cli culprit: --strategy must be row_wise or batch_invariant\n";
      exit_code = kExitUsage;
      return;
    }
    co.cost_repeats = std::max(0, opts->cost_repeats);
    co.lockstep_trials = !opts->free_trials;
    co.narrow_layers = !opts->no_narrow;
    co.fewer_trials = !opts->plain_search;
    co.horizon_ticks = opts->horizon_ticks;
    if (!resolve_spec(opts->spec, "culprit", exit_code)) {
      return;
    }
    compute_and_write(
        opts->spec,
        [&](const experiment::RunControl& control) {
          return analysis::run_culprit_experiment(opts->spec.spec, co, control);
        },
        exit_code);
  });
}

}  // namespace batchlens::cli
