// SPDX-License-Identifier: Apache-2.0
#include "core/setup/front_door.h"

#include <chrono>
#include <map>
#include <mutex>
#include <system_error>

#include "core/model/config.h"
#include "core/model/diffusion_gemma.h"
#include "core/text/chat_template.h"
#include "core/text/tokenizer_builder.h"

namespace batchlens::setup {

namespace {

using base::take;

using base::ErrorCode;

}  // namespace

std::string Inputs::decode_until_stop(const std::vector<std::int64_t>& tokens,
                                      std::int64_t stop_position) const {
  if (!tokenizer) {
    return {};
  }
  const bool stops = stop_position >= 0 && static_cast<std::size_t>(stop_position) < tokens.size();
  const auto end = stops ? tokens.begin() + stop_position + 1 : tokens.end();
  return tokenizer->decode(std::vector<std::int64_t>(tokens.begin(), end));
}

base::Result<std::shared_ptr<const text::Tokenizer>> tokenizer_for(
    const model::ModelSource& source) {
  using Shared = std::shared_ptr<const text::Tokenizer>;
  if (!source.checkpoint_dir.empty()) {
    const auto path = source.checkpoint_dir / "tokenizer.json";
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      return base::Error{ErrorCode::FileNotFound, "no tokenizer.json in " +
                                                      source.checkpoint_dir.string() +
                                                      ": give the prompt as token ids"};
    }
    auto t = text::Tokenizer::from_file(path);
    if (!t.ok()) {
      return t.error();
    }
    return Shared(std::make_shared<const text::Tokenizer>(std::move(t).value()));
  }
  auto config = model::load_preset(source.preset);
  if (!config.ok()) {
    return config.error();
  }
  // A preset's tokenizer is generated; build it once per vocabulary size.
  const std::int64_t vocab = config.value().text.vocab_size;
  static std::mutex mutex;
  static std::map<std::int64_t, Shared> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(vocab); it != cache.end()) {
    return it->second;
  }
  auto json = text::preset_tokenizer_json(vocab);
  if (!json.ok()) {
    return json.error();
  }
  auto t = text::Tokenizer::from_json(json.value());
  if (!t.ok()) {
    return t.error();
  }
  Shared shared = std::make_shared<const text::Tokenizer>(std::move(t).value());
  cache.emplace(vocab, shared);
  return shared;
}

base::Result<sampling::GenerationConfig> generation_config_for(
    const model::ModelSource& source, const sampling::GenerationOverrides& overrides) {
  if (source.checkpoint_dir.empty()) {
    return sampling::apply(overrides, sampling::GenerationConfig{});
  }
  auto file = sampling::load_generation_config(source.checkpoint_dir);
  if (!file.ok()) {
    return file.error();
  }
  return sampling::apply(overrides, file.value());
}

base::Result<Inputs> prepare(const model::ModelSource& source, const Prompt& prompt,
                             const sampling::GenerationOverrides& overrides) {
  return base::guarded([&]() -> Inputs {
    Inputs in;
    in.generation = take(generation_config_for(source, overrides));
    if (auto t = tokenizer_for(source); t.ok()) {
      in.tokenizer = std::move(t).value();
    } else if (prompt.ids.empty() || t.error().code != ErrorCode::FileNotFound) {
      throw base::ErrorException(t.error());
    }
    in.prompt_ids = !prompt.ids.empty()
                        ? prompt.ids
                        : take(in.tokenizer->encode(
                              prompt.chat_template ? text::chat_prompt(prompt.text) : prompt.text));
    if (in.prompt_ids.empty()) {
      base::raise(ErrorCode::InvalidArgument, "the prompt has no tokens");
    }
    in.prompt_text = in.tokenizer ? in.tokenizer->decode(in.prompt_ids) : std::string();
    return in;
  });
}

base::Result<Session> open_session(const model::ModelSource& source, model::LoadOptions load,
                                   const Prompt& prompt,
                                   const sampling::GenerationOverrides& overrides) {
  return base::guarded([&]() -> Session {
    Session s;
    s.source = source;
    s.inputs = take(prepare(source, prompt, overrides));
    load.workload.prompt_tokens = static_cast<std::int64_t>(s.inputs.prompt_ids.size());
    load.workload.new_tokens = s.inputs.generation.max_new_tokens;
    const auto start = std::chrono::steady_clock::now();
    s.model = take(model::load_model(source, load));
    s.load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    s.config_json = model::to_json(s.model->config()).dump(2);
    const std::int64_t vocab = s.model->config().text.vocab_size;
    for (const std::int64_t id : s.inputs.prompt_ids) {
      if (id < 0 || id >= vocab) {
        base::raise(ErrorCode::InvalidArgument, "prompt token id " + std::to_string(id) +
                                                    " is outside the vocabulary (0.." +
                                                    std::to_string(vocab - 1) + ")");
      }
    }
    return s;
  });
}

}  // namespace batchlens::setup
