// SPDX-License-Identifier: Apache-2.0
// The `batchlens-cli run` command line that reproduces an experiment: what the GUI offers to copy
// for a GPU server, and what reports quote. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/experiment/experiment.h"

namespace batchlens::experiment {

/// `text` quoted for a POSIX shell when it needs it (single quotes, ' as '\''); as is otherwise.
std::string shell_quote(const std::string& text);

/// "batchlens-cli run --preset mid --device cuda:0 ... --out OUT": every field of `spec` that
/// changes what runs, spelled as the CLI's options, each argument shell-quoted. `prompt_ids`,
/// when not empty, are given as --prompt-ids (the exact ids the experiment ran) instead of the
/// prompt text; `out` is the experiment file to write. Generation overrides without an option
/// and switches set in the environment are named in a trailing shell comment ("  # also ...").
std::string cli_run_command(const ExperimentSpec& spec, const std::vector<std::int64_t>& prompt_ids,
                            const std::string& out);

}  // namespace batchlens::experiment
