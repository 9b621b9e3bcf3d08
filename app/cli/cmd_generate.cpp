// SPDX-License-Identifier: Apache-2.0
#include <cstdio>
#include <iostream>
#include <memory>

#include "app/cli/cli_progress.h"
#include "app/cli/command.h"
#include "app/cli/model_options.h"
#include "core/generation/modes.h"
#include "core/setup/generate_api.h"
#include "core/setup/prompt.h"

namespace batchlens::cli {

void register_generate(CLI::App& app, int& exit_code) {
  struct Options {
    ModelOptions model;
    setup::GenerateRequest request;
    std::string prompt_ids;
    std::string rng = "per_row";
    std::string prefill = "copied";
    std::string policy = "default";
    std::string companions;
    std::string positions = "shared";
    bool raw = false;
    bool show_ids = false;
    bool json = false;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "generate",
      "Block-diffusion generation: prints each row's text, steps taken and stop position");
  add_model_options(cmd, opts->model);
  auto& rq = opts->request;
  auto& ov = rq.overrides;
  auto* text = cmd->add_option("--prompt", rq.prompt.text,
                               "Prompt text, wrapped in the Gemma chat template unless --raw");
  auto* ids = cmd->add_option("--prompt-ids", opts->prompt_ids,
                              "Prompt token ids, comma-separated, used as they are");
  text->excludes(ids);
  cmd->add_flag("--raw", opts->raw, "Do not apply the chat template to --prompt");
  cmd->add_option("--batch", rq.batch_size, "Batch size (identical rows without --companions)")
      ->capture_default_str();
  cmd->add_option("--companions", opts->companions,
                  "Prompts of the other rows (one per line, or JSON Lines with "
                  "\"prompt\"/\"prompt_ids\"), cycled: a batch of different prompts, left-padded "
                  "and masked as transformers' generate builds it");
  cmd->add_option("--row", rq.row, "Which row holds --prompt (with --companions)")
      ->capture_default_str();
  cmd->add_option("--positions", opts->positions,
                  "Position ids of a padded batch: shared (transformers' generate) or per_row")
      ->capture_default_str();
  cmd->add_option("--gen-seed", rq.seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--steps", ov.max_denoising_steps,
                  "max_denoising_steps [generation_config.json, else 48]");
  cmd->add_option("--max-new-tokens", ov.max_new_tokens,
                  "max_new_tokens [generation_config.json, else 256]");
  cmd->add_option("--t-min", ov.t_min, "Temperature at the last step [0.4]");
  cmd->add_option("--t-max", ov.t_max, "Temperature at the first step [0.8]");
  cmd->add_option("--entropy-bound", ov.entropy_bound, "Entropy-bound acceptance [0.1]");
  cmd->add_option("--stability-threshold", ov.stability_threshold,
                  "Steps the argmax must stay unchanged before stopping [1]");
  cmd->add_option("--confidence-threshold", ov.confidence_threshold,
                  "Mean entropy below which a stable canvas stops [0.005]");
  cmd->add_option("--rng", opts->rng, "per_row (BatchLens) or shared (the reference)")
      ->capture_default_str();
  cmd->add_option("--prefill", opts->prefill,
                  "copied (batch-1 cache copied into every row) or batched")
      ->capture_default_str();
  cmd->add_option("--policy", opts->policy,
                  "default, issue_workaround, row_wise_all, ... or a JSON file; join with +")
      ->capture_default_str();
  cmd->add_flag("--show-ids", opts->show_ids, "Print the token ids too");
  cmd->add_option("--record", rq.record_path,
                  "Write every denoising step (canvas, draws, argmax, acceptance, entropy) to this "
                  "safetensors file (for tools/parity)");
  cmd->add_flag("--record-logits", rq.record_logits,
                "With --record: also each canvas's first-step logits [B, C, V]");
  cmd->add_flag("--json", opts->json, "Print the result as JSON");
  cmd->callback([opts, &exit_code] {
    auto& mo = opts->model;
    auto& request = opts->request;
    if (mo.source.preset.empty() && mo.checkpoint.empty()) {
      std::cerr << "batchlens-cli generate: give --preset or --checkpoint\n";
      exit_code = kExitUsage;
      return;
    }
    if (!parse_mode(opts->rng, generation::parse_rng_mode, request.rng, "generate", exit_code) ||
        !parse_mode(opts->prefill, generation::parse_prefill_mode, request.prefill, "generate",
                    exit_code) ||
        !parse_mode(opts->positions, generation::parse_position_mode, request.positions, "generate",
                    exit_code) ||
        !resolve_policy(opts->policy, request.policy, exit_code)) {
      return;
    }
    if (!opts->companions.empty()) {
      // Read and checked before any work: an empty file, invalid UTF-8, a 100 MB line.
      auto companions = setup::read_prompts(opts->companions, "companions file");
      if (!companions.ok()) {
        std::cerr << "batchlens-cli generate: " << companions.error().message << "\n";
        exit_code = kExitUsage;
        return;
      }
      request.companions = std::move(companions.value());
      if (request.prefill == generation::PrefillMode::Copied) {
        request.prefill = generation::PrefillMode::Batched;  // a batch of different prompts
      }
    }
    if (request.prompt.text.empty() && opts->prompt_ids.empty()) {
      std::cerr << "batchlens-cli generate: give --prompt TEXT or --prompt-ids IDS\n";
      exit_code = kExitUsage;
      return;
    }
    std::string bad;
    if (!parse_int_list(opts->prompt_ids, request.prompt.ids, bad)) {
      std::cerr << "batchlens-cli generate: bad token id '" << bad << "'\n";
      exit_code = kExitUsage;
      return;
    }
    request.prompt.chat_template = !opts->raw;
    mo.source.checkpoint_dir = mo.checkpoint;
    base::Result<setup::GenerateReport> result = base::Error{};
    {
      const SigintCancel sigint;
      request.cancel = sigint.token();
      request.progress = draw_progress;
      result = setup::run_generation(mo.source, mo.load, request);
    }
    std::fprintf(stderr, "\n");
    if (!result.ok()) {
      exit_code = report_error(result.error());
      return;
    }
    std::cout << (opts->json ? setup::report_json(result.value())
                             : setup::format_report(result.value(), opts->show_ids));
    exit_code = kExitOk;
  });
}

}  // namespace batchlens::cli
