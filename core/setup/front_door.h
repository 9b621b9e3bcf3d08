// SPDX-License-Identifier: Apache-2.0
// The front door: from a model source, load options, a prompt and generation overrides, build
// once what every caller needs (generation config, tokenizer, prompt ids, the model) with typed
// errors. The experiment runner, one-shot generation, the CLI and the GUI go through it; nothing
// else loads a model or a tokenizer. Torch-free header.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/generation/generation_config.h"
#include "core/model/loader.h"
#include "core/setup/prompt.h"
#include "core/text/tokenizer.h"

namespace batchlens::setup {

/// What a run needs besides the weights.
struct Inputs {
  generation::GenerationConfig generation;  ///< generation_config.json (defaults) + overrides
  /// The source's tokenizer; null for a checkpoint without tokenizer.json given prompt ids.
  std::shared_ptr<const text::Tokenizer> tokenizer;
  std::vector<std::int64_t> prompt_ids;  ///< what the model sees
  std::string prompt_text;               ///< the ids decoded ("" without a tokenizer)

  /// `tokens` decoded up to and including `stop_position` (all when -1), specials kept; "" without
  /// a tokenizer.
  std::string decode_until_stop(const std::vector<std::int64_t>& tokens,
                                std::int64_t stop_position) const;
};

/// A loaded model, its tokenizer and the inputs it was opened with (every prompt id inside its
/// vocabulary). Many runs can share one: prepare() makes inputs for other prompts and overrides
/// without loading anything again.
struct Session {
  model::ModelSource source;
  model::LoadOptions load;  ///< how it was loaded (device, dtype, experts; no callbacks)
  std::shared_ptr<const model::DiffusionGemma> model;
  /// The source's tokenizer; null for a checkpoint without tokenizer.json.
  std::shared_ptr<const text::Tokenizer> tokenizer;
  Inputs inputs;            ///< those of open_session (empty after open_model)
  std::string config_json;  ///< the model's config.json as it ran
  double load_s = 0.0;      ///< seconds spent loading or building it
  /// Seconds spent on the tokenizer and the inputs before the model (a preset's generated
  /// tokenizer: ~4 s for the 26B-A4B architecture's 262144 pieces on a 2-core CPU).
  double prepare_s = 0.0;
  /// A CPU model's threads as measured at load (setup/cpu_threads.h): one line, "" on a GPU or
  /// with BATCHLENS_THREAD_CHOICE=0.
  std::string threads_report;

  /// Inputs for another prompt or overrides against this model: the source's generation config
  /// with `overrides`, this session's tokenizer, prompt ids checked against the vocabulary.
  /// Errors as prepare()'s, InvalidArgument for an id outside the vocabulary. Never throws.
  base::Result<Inputs> prepare(const Prompt& prompt,
                               const generation::GenerationOverrides& overrides) const;

  /// The ids of `companions` (issue #35: the other rows of a mixed batch beside `inputs`'
  /// prompt), each prepared as prepare() does, before any work: InvalidArgument naming the
  /// companion ("companion 2: ...") for a bad one, and for the prompt or a companion too long
  /// for the model's context with `inputs`' canvases after it (a padded batch's canvases come
  /// after its longest row). Never throws.
  base::Result<std::vector<std::vector<std::int64_t>>> prepare_companions(
      const std::vector<Prompt>& companions, const Inputs& inputs,
      const generation::GenerationOverrides& overrides) const;
};

/// A tokenizer.json file. Errors: those of text::Tokenizer::from_file. Never throws.
base::Result<std::shared_ptr<const text::Tokenizer>> tokenizer_from_file(
    const std::filesystem::path& path);

/// The generated tokenizer.json of a preset (what save-model writes and `tokenize --export`
/// exports). Errors: InvalidArgument for an unknown preset. Never throws.
base::Result<std::string> preset_tokenizer_json(const std::string& preset);

/// The tokenizer of a source: a checkpoint's tokenizer.json (FileNotFound when it has none), or
/// the preset's generated one (built once per vocabulary size and shared).
base::Result<std::shared_ptr<const text::Tokenizer>> tokenizer_for(
    const model::ModelSource& source);

/// The generation config of a source (a checkpoint's generation_config.json, else the released
/// defaults) with `overrides` applied.
base::Result<generation::GenerationConfig> generation_config_for(
    const model::ModelSource& source, const generation::GenerationOverrides& overrides);

/// Generation config, tokenizer and prompt ids, without loading the model. InvalidArgument for an
/// empty prompt or text without a tokenizer. Never throws.
base::Result<Inputs> prepare(const model::ModelSource& source, const Prompt& prompt,
                             const generation::GenerationOverrides& overrides);

/// load_model() with `load` and the source's tokenizer when it has one (no prompt: `forward`, and
/// callers that prepare inputs per run). Errors: those of load_model and of reading the
/// tokenizer. Never throws.
base::Result<Session> open_model(const model::ModelSource& source, model::LoadOptions load);

/// prepare(), then load_model() with `load` (its workload's prompt and new-token counts are
/// filled from the inputs for the memory check), then the prompt ids checked against the
/// vocabulary. Errors: those of prepare and load_model, InvalidArgument. Never throws.
base::Result<Session> open_session(const model::ModelSource& source, model::LoadOptions load,
                                   const Prompt& prompt,
                                   const generation::GenerationOverrides& overrides);

}  // namespace batchlens::setup
