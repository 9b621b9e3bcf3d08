// SPDX-License-Identifier: Apache-2.0
// The front door: from a model source, load options, a prompt and generation overrides, build
// once what every caller needs (generation config, tokenizer, prompt ids, the model) with typed
// errors. The experiment runner, one-shot generation, the CLI and the GUI go through it; nothing
// else loads a model or a tokenizer. Torch-free header.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/model/loader.h"
#include "core/sampling/generation_config.h"
#include "core/text/tokenizer.h"

namespace batchlens::setup {

/// The prompt: text (through the Gemma chat template unless `chat_template` is false), or token
/// ids, which win when set.
struct Prompt {
  std::string text;
  bool chat_template = true;
  std::vector<std::int64_t> ids;
};

/// What a run needs besides the weights.
struct Inputs {
  sampling::GenerationConfig generation;  ///< generation_config.json (defaults) + overrides
  /// The source's tokenizer; null for a checkpoint without tokenizer.json given prompt ids.
  std::shared_ptr<const text::Tokenizer> tokenizer;
  std::vector<std::int64_t> prompt_ids;  ///< what the model sees
  std::string prompt_text;               ///< the ids decoded ("" without a tokenizer)

  /// `tokens` decoded up to and including `stop_position` (all when -1), specials kept; "" without
  /// a tokenizer.
  std::string decode_until_stop(const std::vector<std::int64_t>& tokens,
                                std::int64_t stop_position) const;
};

/// A loaded model with the inputs checked against it (every prompt id inside its vocabulary).
struct Session {
  model::ModelSource source;
  Inputs inputs;
  std::shared_ptr<const model::DiffusionGemma> model;
  std::string config_json;  ///< the model's config.json as it ran
  double load_s = 0.0;      ///< seconds spent loading or building it
};

/// The tokenizer of a source: a checkpoint's tokenizer.json (FileNotFound when it has none), or
/// the preset's generated one (built once per vocabulary size and shared).
base::Result<std::shared_ptr<const text::Tokenizer>> tokenizer_for(
    const model::ModelSource& source);

/// The generation config of a source (a checkpoint's generation_config.json, else the released
/// defaults) with `overrides` applied.
base::Result<sampling::GenerationConfig> generation_config_for(
    const model::ModelSource& source, const sampling::GenerationOverrides& overrides);

/// Generation config, tokenizer and prompt ids, without loading the model. InvalidArgument for an
/// empty prompt or text without a tokenizer. Never throws.
base::Result<Inputs> prepare(const model::ModelSource& source, const Prompt& prompt,
                             const sampling::GenerationOverrides& overrides);

/// prepare(), then load_model() with `load` (its workload's prompt and new-token counts are
/// filled from the inputs for the memory check), then the prompt ids checked against the
/// vocabulary. Errors: those of prepare and load_model, InvalidArgument. Never throws.
base::Result<Session> open_session(const model::ModelSource& source, model::LoadOptions load,
                                   const Prompt& prompt,
                                   const sampling::GenerationOverrides& overrides);

}  // namespace batchlens::setup
