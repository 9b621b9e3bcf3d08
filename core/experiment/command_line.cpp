// SPDX-License-Identifier: Apache-2.0
#include "core/experiment/command_line.h"

#include <sstream>

#include "core/generation/modes.h"
#include "core/ops/policy.h"

namespace batchlens::experiment {

namespace {

template <class T>
std::string joined(const std::vector<T>& values) {
  std::ostringstream out;
  for (std::size_t i = 0; i < values.size(); ++i) {
    out << (i == 0 ? "" : ",") << values[i];
  }
  return out.str();
}

}  // namespace

std::string shell_quote(const std::string& text) {
  const bool plain = !text.empty() && text.find_first_not_of(
                                          "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                          "0123456789_-+.,:/=@%") == std::string::npos;
  if (plain) {
    return text;
  }
  std::string out = "'";
  for (const char c : text) {
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  }
  return out + "'";
}

std::string cli_run_command(const ExperimentSpec& spec, const std::vector<std::int64_t>& prompt_ids,
                            const std::string& out) {
  std::string cmd = "batchlens-cli run";
  const auto arg = [&cmd](const std::string& option, const std::string& value) {
    cmd += " " + option + " " + shell_quote(value);
  };
  if (spec.model.preset.empty()) {
    arg("--checkpoint", spec.model.checkpoint_dir.string());
  } else {
    arg("--preset", spec.model.preset);
    arg("--seed", std::to_string(spec.model.seed));
  }
  arg("--device", spec.load.device);
  arg("--dtype", spec.load.dtype);
  arg("--experts", spec.load.experts);
  const std::vector<std::int64_t>& ids = prompt_ids.empty() ? spec.prompt_ids : prompt_ids;
  if (!ids.empty()) {
    arg("--prompt-ids", joined(ids));
  } else {
    arg("--prompt", spec.prompt);
    if (!spec.chat_template) {
      cmd += " --raw";
    }
  }
  arg("--gen-seed", std::to_string(spec.seed));
  if (spec.overrides.max_denoising_steps) {
    arg("--steps", std::to_string(*spec.overrides.max_denoising_steps));
  }
  if (spec.overrides.max_new_tokens) {
    arg("--max-new-tokens", std::to_string(*spec.overrides.max_new_tokens));
  }
  arg("--batch-sizes", joined(spec.batch_sizes));
  arg("--repeats", std::to_string(spec.repeats));
  arg("--rng", generation::name(spec.rng));
  arg("--prefill", generation::name(spec.prefill));
  if (spec.composition.row != 0) {
    arg("--row", std::to_string(spec.composition.row));
  }
  if (spec.composition.mixed()) {
    arg("--companions", "COMPANIONS.jsonl");
    arg("--positions", generation::name(spec.composition.positions));
  }
  arg("--mode", name(spec.mode));
  arg("--policy", ops::policy_text(spec.policy));
  if (spec.workaround) {
    arg("--workaround", ops::policy_text(*spec.workaround));
  }
  if (!spec.taps.empty()) {
    arg("--taps", joined(spec.taps));
  }
  // Kernel provenance (--no-kernels) is left at the default: recording it never changes the
  // runs, and a file made before it existed would otherwise ask for it to be skipped.
  arg("--out", out);
  // What the command line cannot say is named, so a reader knows the command is not the whole
  // story: generation overrides without an option, switches set in the environment.
  std::string also;
  const generation::GenerationOverrides& ov = spec.overrides;
  if (ov.t_min || ov.t_max || ov.entropy_bound || ov.stability_threshold ||
      ov.confidence_threshold) {
    also = "generation overrides without an option (see the file's spec JSON)";
  }
  if (spec.composition.mixed()) {
    also += (also.empty() ? "" : "; ") + std::to_string(spec.composition.companions.size()) +
            " companion prompts: write the file's spec JSON 'composition.companions' to "
            "COMPANIONS.jsonl, one per line";
  }
  if (const std::string switches = spec.load.switches.describe(); !switches.empty()) {
    also += (also.empty() ? "" : "; ") + std::string("set in the environment: ") + switches;
  }
  if (!also.empty()) {
    cmd += "  # also " + also;
  }
  return cmd;
}

}  // namespace batchlens::experiment
