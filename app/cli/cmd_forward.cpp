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

void register_forward(CLI::App& app, int& exit_code) {
  struct Options {
    ModelOptions model;
    setup::ForwardRequest request;
    std::string policy = "default";
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "forward",
      "Encoder prefill + one decoder forward; writes logits and chosen taps (safetensors)");
  add_model_options(cmd, opts->model);
  cmd->add_option("--inputs", opts->request.inputs,
                  "safetensors with input_ids [B,L], decoder_input_ids [B,C] and optionally "
                  "self_conditioning_logits [B,C,V]; without it, seeded random inputs")
      ->check(CLI::ExistingFile);
  cmd->add_option("--prompt-len", opts->request.prompt_length, "Random inputs: prompt length")
      ->capture_default_str();
  cmd->add_option("--input-seed", opts->request.input_seed, "Random inputs: seed")
      ->capture_default_str();
  cmd->add_flag("--self-conditioning", opts->request.self_conditioning,
                "Random inputs: also pass random self-conditioning logits");
  cmd->add_option("--out", opts->request.output,
                  "Output safetensors (logits + taps); without it nothing is written");
  cmd->add_option("--taps", opts->request.taps,
                  "Taps to write, e.g. router.scores attn.o_proj logits, or all")
      ->delimiter(',');
  cmd->add_option("--rows", opts->request.rows,
                  "Use row 0 of the inputs repeated to this many identical rows");
  cmd->add_option("--repeat", opts->request.repeat,
                  "Also time this many decoder passes (no taps) and print median and min");
  cmd->add_option("--profile", opts->request.profile,
                  "CUDA builds: profile three decoder passes and write a Chrome trace (JSON) here "
                  "(bench/kernel_table.py summarises it)");
  cmd->add_flag("--cuda-graph", opts->request.cuda_graph,
                "With --repeat on CUDA: also time sync-free eager passes and CUDA graph replays "
                "(checked bitwise against eager)");
  cmd->add_option("--policy", opts->policy,
                  "default, issue_workaround, row_wise_all or a policy JSON file")
      ->capture_default_str();
  cmd->callback([opts, &exit_code] {
    auto& mo = opts->model;
    if (mo.source.preset.empty() && mo.checkpoint.empty()) {
      std::cerr << "batchlens-cli forward: give --preset or --checkpoint\n";
      exit_code = kExitUsage;
      return;
    }
    if (!resolve_policy(opts->policy, opts->request.policy, exit_code)) {
      return;
    }
    mo.source.checkpoint_dir = mo.checkpoint;
    const auto session = setup::open_model(mo.source, mo.load);
    if (!session.ok()) {
      exit_code = report_error(session.error());
      return;
    }
    const auto summary = setup::run_forward_file(*session.value().model, opts->request);
    if (!summary.ok()) {
      exit_code = report_error(summary.error());
      return;
    }
    const auto& s = summary.value();
    std::cout << "forward: " << mo.source.describe() << " on " << mo.load.device << " ("
              << mo.load.dtype << ", experts " << mo.load.experts << ")\n"
              << "  batch " << s.batch << ", prompt " << s.prompt_length << ", canvas "
              << s.canvas_length << ", self-conditioning " << (s.self_conditioning ? "yes" : "no")
              << "\n  CPU ISA: " << base::describe(base::query_cpu_isa())
              << (session.value().threads_report.empty() ? std::string()
                                                         : "\n  " + session.value().threads_report)
              << "\n  encode " << s.encode_ms << " ms, decode " << s.decode_ms << " ms";
    if (opts->request.repeat > 0) {
      std::cout << ", decode x" << opts->request.repeat << ": median " << s.decode_median_ms
                << " ms, min " << s.decode_min_ms << " ms";
    }
    if (!s.graph_error.empty()) {
      std::cout << "\n  cuda graph FAILED: " << s.graph_error;
    } else if (opts->request.repeat > 0 && opts->request.cuda_graph) {
      std::cout << "\n  no-sync eager x" << opts->request.repeat << ": median "
                << s.nosync_median_ms << " ms, min " << s.nosync_min_ms << " ms"
                << "\n  cuda graph x" << opts->request.repeat << ": median " << s.graph_median_ms
                << " ms, min " << s.graph_min_ms << " ms (capture " << s.graph_capture_ms
                << " ms), logits " << (s.graph_bitwise ? "bitwise equal" : "DIFFER") << " to eager";
      if (s.fused_ran) {
        std::cout << "\n  fused no-sync eager x" << opts->request.repeat << ": median "
                  << s.fused_nosync_median_ms << " ms"
                  << "\n  fused cuda graph x" << opts->request.repeat << ": median "
                  << s.fused_graph_median_ms << " ms, min " << s.fused_graph_min_ms
                  << " ms, logits " << (s.fused_bitwise ? "bitwise equal" : "DIFFER")
                  << " to unfused eager";
      }
    }
    if (!s.fused_report.empty()) {
      std::cout << "\n  " << s.fused_report;
    }
    std::cout << "\n"
              << "  wrote " << s.tensors_written << " tensors to "
              << (opts->request.output.empty() ? std::string("nothing (no --out)")
                                               : opts->request.output.string())
              << "\n";
    exit_code = kExitOk;
  });
}

}  // namespace batchlens::cli
