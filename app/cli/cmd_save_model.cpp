// SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "app/cli/cli_progress.h"
#include "app/cli/command.h"
#include "app/cli/model_options.h"
#include "core/base/system_info.h"
#include "core/setup/forward_file.h"
#include "core/setup/front_door.h"
#include "core/setup/random_model.h"

namespace batchlens::cli {

void register_save_model(CLI::App& app, int& exit_code) {
  struct Options {
    std::string preset;
    std::uint64_t seed = 0;
    std::string out;
    double shard_gib = 4.0;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "save-model",
      "Write a preset's weights (seeded random, or a trained preset's bundled checkpoint) as an HF "
      "checkpoint directory");
  cmd->add_option("--preset", opts->preset, preset_help())->required();
  cmd->add_option("--seed", opts->seed, "Random-weight seed (random-weight presets)")
      ->capture_default_str();
  cmd->add_option("--out", opts->out, "Directory to write")->required();
  cmd->add_option("--shard-gib", opts->shard_gib, "Largest shard in GiB")->capture_default_str();
  cmd->callback([opts, &exit_code] {
    const auto shard = static_cast<std::uint64_t>(opts->shard_gib * 1024.0 * 1024.0 * 1024.0);
    const auto r = setup::save_random_model(opts->preset, opts->seed, opts->out, shard);
    if (!r.ok()) {
      exit_code = report_error(r.error());
      return;
    }
    model::ModelSource source;
    source.preset = opts->preset;
    source.seed = opts->seed;
    std::cout << "save-model: wrote " << source.describe() << " to " << opts->out << "\n";
    exit_code = kExitOk;
  });
}

}  // namespace batchlens::cli
