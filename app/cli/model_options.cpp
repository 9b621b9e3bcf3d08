// SPDX-License-Identifier: Apache-2.0
#include "app/cli/model_options.h"

#include <iostream>
#include <sstream>
#include <stdexcept>

#include "app/cli/command.h"
#include "core/model/config.h"

namespace batchlens::cli {

std::string preset_help() {
  std::string random;
  std::string trained;
  for (const std::string& name : model::preset_names()) {
    std::string& list = model::preset_bundle(name).trained() ? trained : random;
    list += (list.empty() ? "" : ", ") + name;
  }
  std::string help = "Shipped model preset: " + random + " (seeded random weights)";
  if (!trained.empty()) {
    help += "; " + trained + " (trained weights, bundled)";
  }
  return help;
}

void add_model_options(CLI::App* cmd, ModelOptions& options) {
  auto* preset = cmd->add_option("--preset", options.source.preset, preset_help());
  auto* ckpt = cmd->add_option("--checkpoint", options.checkpoint,
                               "HF checkpoint directory (config.json + safetensors)");
  preset->excludes(ckpt);
  ckpt->excludes(preset);
  cmd->add_option("--seed", options.source.seed, "Seed of the preset's random weights")
      ->capture_default_str();
  cmd->add_option("--device", options.load.device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dtype", options.load.dtype, "bf16, or fp32 (CPU only)")->capture_default_str();
  cmd->add_option("--experts", options.load.experts,
                  "Experts implementation: eager (the modeling file's loop) or grouped_mm "
                  "(torch._grouped_mm, CUDA)")
      ->capture_default_str();
  // The program's edge: fused kernels and CUDA graphs as the environment sets them.
  options.load.switches = base::Switches::from_environment();
}

bool parse_int_list(const std::string& text, std::vector<std::int64_t>& out, std::string& bad) {
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      std::size_t used = 0;
      out.push_back(std::stoll(item, &used));
      if (used != item.size()) {
        throw std::invalid_argument(item);
      }
    } catch (const std::exception&) {
      bad = item;
      return false;
    }
  }
  return true;
}

bool resolve_policy(const std::string& text, ops::OpPolicy& out, int& exit_code) {
  auto policy = ops::policy_from_argument(text);
  if (!policy.ok()) {
    // Refused before any work: a bad command line (issue #34).
    report_error(policy.error());
    exit_code = kExitUsage;
    return false;
  }
  out = std::move(policy).value();
  return true;
}

int report_error(const base::Error& error) {
  std::cerr << "batchlens-cli: " << error.message << " (" << base::to_string(error.code) << ")\n";
  return error.code == base::ErrorCode::Cancelled ? kExitCancelled : kExitFailure;
}

}  // namespace batchlens::cli
