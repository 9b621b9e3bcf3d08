// SPDX-License-Identifier: Apache-2.0
#include <memory>

#include "app/cli/command.h"
#include "app/cli/spec_options.h"
#include "core/analysis/explain.h"
#include "core/experiment/experiment.h"
#include "core/experiment/runner.h"

namespace batchlens::cli {

void register_run(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<SpecOptions>();
  auto* cmd = app.add_subcommand(
      "run",
      "Run a paired batch-size experiment (B=1 reference, B=1 repeats, batched runs; optionally "
      "again with a workaround policy) and write it to an HDF5 experiment file");
  add_spec_options(cmd, *opts, /*workaround=*/true);
  cmd->add_flag("--no-causes", opts->no_causes,
                "With --companions: do not re-run (every op batch-invariant, per-row positions, "
                "both) to tell the positions, the padding and the kernels apart");
  cmd->add_flag("--no-exact", opts->no_exact,
                "Do not recompute the first divergent op and the step's logits in fp64 (the "
                "exact reference: which batch size lies closer to exact)");
  cmd->callback([opts, &exit_code] {
    if (!resolve_spec(*opts, "run", exit_code)) {
      return;
    }
    compute_and_write(
        *opts,
        [&](const experiment::RunControl& control) {
          return analysis::run_and_explain(opts->spec, {!opts->no_causes, !opts->no_exact},
                                           control);
        },
        exit_code);
  });
}

}  // namespace batchlens::cli
