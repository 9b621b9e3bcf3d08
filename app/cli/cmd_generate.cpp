// SPDX-License-Identifier: Apache-2.0
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>

#include "app/cli/command.h"
#include "app/cli/model_options.h"
#include "core/sampling/generate_api.h"

namespace batchlens::cli {

namespace {

base::CancelToken* g_cancel = nullptr;

extern "C" void on_sigint(int /*signal*/) {
  if (g_cancel != nullptr) {
    g_cancel->cancel();  // an atomic store: async-signal-safe
  }
}

// "[#####.....] canvas 1 step 12/48  ETA 3.2s" on stderr, redrawn in place.
void draw_progress(const base::Progress& p) {
  const int width = 30;
  const auto filled = static_cast<int>(p.fraction() * width);
  std::fprintf(stderr, "\r[%s%s] %3.0f%%  %-28s", std::string(filled, '#').c_str(),
               std::string(width - filled, '.').c_str(), 100.0 * p.fraction(), p.stage.c_str());
  if (p.eta_s >= 0) {
    std::fprintf(stderr, " ETA %.1fs ", p.eta_s);
  }
  std::fflush(stderr);
}

}  // namespace

void register_generate(CLI::App& app, int& exit_code) {
  struct Options {
    ModelOptions model;
    sampling::GenerateRequest request;
    std::string prompt_ids;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "generate", "Block-diffusion generation: prints each row's tokens, steps and stop position");
  add_model_options(cmd, opts->model);
  cmd->add_option("--prompt-ids", opts->prompt_ids,
                  "Prompt token ids, comma-separated (e.g. the chat-template ids)")
      ->required();
  cmd->add_option("--batch", opts->request.batch_size, "Batch size (identical rows)")
      ->capture_default_str();
  cmd->add_option("--gen-seed", opts->request.seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--steps", opts->request.max_denoising_steps, "max_denoising_steps")
      ->capture_default_str();
  cmd->add_option("--max-new-tokens", opts->request.max_new_tokens, "max_new_tokens")
      ->capture_default_str();
  cmd->add_option("--rng", opts->request.rng, "per_row (BatchLens) or shared (the reference)")
      ->capture_default_str();
  cmd->add_option("--prefill", opts->request.prefill,
                  "copied (batch-1 cache copied into every row) or batched")
      ->capture_default_str();
  cmd->add_option("--policy", opts->request.policy, "default, issue_workaround or row_wise_all")
      ->capture_default_str();
  cmd->callback([opts, &exit_code] {
    auto& mo = opts->model;
    if (mo.source.preset.empty() && mo.checkpoint.empty()) {
      std::cerr << "batchlens-cli generate: give --preset or --checkpoint\n";
      exit_code = kExitUsage;
      return;
    }
    std::stringstream ss(opts->prompt_ids);
    std::string item;
    while (std::getline(ss, item, ',')) {
      try {
        opts->request.prompt.push_back(std::stoll(item));
      } catch (const std::exception&) {
        std::cerr << "batchlens-cli generate: bad token id '" << item << "'\n";
        exit_code = kExitUsage;
        return;
      }
    }
    mo.source.checkpoint_dir = mo.checkpoint;
    base::CancelToken cancel;
    g_cancel = &cancel;
    const auto previous = std::signal(SIGINT, on_sigint);
    opts->request.cancel = &cancel;
    opts->request.progress = draw_progress;
    const auto result = sampling::run_generation(mo.source, mo.load, opts->request);
    std::signal(SIGINT, previous);
    g_cancel = nullptr;
    std::fprintf(stderr, "\n");
    if (!result.ok()) {
      exit_code = report_error(result.error());
      return;
    }
    std::cout << result.value();
    exit_code = kExitOk;
  });
}

}  // namespace batchlens::cli
