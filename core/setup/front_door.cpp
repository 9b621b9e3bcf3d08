// SPDX-License-Identifier: Apache-2.0
#include "core/setup/front_door.h"

#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <system_error>

#include "core/base/input.h"
#include "core/model/config.h"
#include "core/model/diffusion_gemma.h"
#include "core/setup/cpu_threads.h"
#include "core/text/chat_template.h"
#include "core/text/tokenizer_builder.h"

namespace batchlens::setup {

using base::ErrorCode;
using base::take;

std::string Inputs::decode_until_stop(const std::vector<std::int64_t>& tokens,
                                      std::int64_t stop_position) const {
  if (!tokenizer) {
    return {};
  }
  const bool stops = stop_position >= 0 && static_cast<std::size_t>(stop_position) < tokens.size();
  const auto end = stops ? tokens.begin() + stop_position + 1 : tokens.end();
  return tokenizer->decode(std::vector<std::int64_t>(tokens.begin(), end));
}

base::Result<std::shared_ptr<const text::Tokenizer>> tokenizer_from_file(
    const std::filesystem::path& path) {
  auto t = text::Tokenizer::from_file(path);
  if (!t.ok()) {
    return t.error();
  }
  return std::shared_ptr<const text::Tokenizer>(
      std::make_shared<const text::Tokenizer>(std::move(t).value()));
}

base::Result<std::string> preset_tokenizer_json(const std::string& preset) {
  auto config = model::load_preset(preset);
  if (!config.ok()) {
    return config.error();
  }
  if (const auto bundled = model::preset_bundle(preset).tokenizer_json; !bundled.empty()) {
    return std::string(bundled);
  }
  return text::preset_tokenizer_json(config.value().text.vocab_size);
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
    return tokenizer_from_file(path);
  }
  // A preset's tokenizer is generated; build it once per preset and share it.
  static std::mutex mutex;
  static std::map<std::string, Shared> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(source.preset); it != cache.end()) {
    return it->second;
  }
  auto config = model::load_preset(source.preset);
  if (!config.ok()) {
    return config.error();
  }
  // A bundled tokenizer.json is read; a generated one is built from its typed spec, without
  // writing and parsing its JSON (4 s of the 26B-A4B preset's 262,144 pieces, issue #37).
  const auto bundled = model::preset_bundle(source.preset).tokenizer_json;
  auto t = !bundled.empty() ? text::Tokenizer::from_json(bundled)
                            : text::preset_tokenizer(config.value().text.vocab_size);
  if (!t.ok()) {
    return t.error();
  }
  Shared shared = std::make_shared<const text::Tokenizer>(std::move(t).value());
  cache.emplace(source.preset, shared);
  return shared;
}

base::Result<generation::GenerationConfig> generation_config_for(
    const model::ModelSource& source, const generation::GenerationOverrides& overrides) {
  if (source.checkpoint_dir.empty()) {
    const auto bundled = model::preset_bundle(source.preset).generation_config_json;
    if (bundled.empty()) {
      return generation::apply(overrides, generation::GenerationConfig{});
    }
    auto file = generation::parse_generation_config(bundled);
    if (!file.ok()) {
      return file.error();
    }
    return generation::apply(overrides, file.value());
  }
  auto file = generation::load_generation_config(source.checkpoint_dir);
  if (!file.ok()) {
    return file.error();
  }
  return generation::apply(overrides, file.value());
}

namespace {

// The inputs of a prompt with a known tokenizer (null: ids only).
Inputs inputs_with(std::shared_ptr<const text::Tokenizer> tokenizer,
                   const model::ModelSource& source, const Prompt& prompt,
                   const generation::GenerationOverrides& overrides) {
  Inputs in;
  in.generation = take(generation_config_for(source, overrides));
  in.tokenizer = std::move(tokenizer);
  if (prompt.ids.empty() && !in.tokenizer) {
    base::raise(ErrorCode::InvalidArgument,
                "no tokenizer in " + source.describe() + ": give the prompt as token ids");
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
}

// The tokenizer of a source, or null when a checkpoint has none.
std::shared_ptr<const text::Tokenizer> optional_tokenizer(const model::ModelSource& source) {
  auto t = tokenizer_for(source);
  if (t.ok()) {
    return std::move(t).value();
  }
  if (t.error().code != ErrorCode::FileNotFound) {
    throw base::ErrorException(t.error());
  }
  return nullptr;
}

void check_vocabulary(const std::vector<std::int64_t>& ids, const model::DiffusionGemma& m) {
  const std::int64_t vocab = m.config().text.vocab_size;
  for (const std::int64_t id : ids) {
    if (id < 0 || id >= vocab) {
      base::raise(ErrorCode::InvalidArgument, "prompt token id " + std::to_string(id) +
                                                  " is outside the vocabulary (0.." +
                                                  std::to_string(vocab - 1) + ")");
    }
  }
}

// Loads the model into `s` (source and tokenizer already set). `settle`, when given, waits for
// the session's other work before a CPU's threads are measured (not counted in load_s).
void load_into(Session& s, model::LoadOptions load, const std::function<void()>& settle = {}) {
  using Clock = std::chrono::steady_clock;
  auto start = Clock::now();
  s.model = take(model::load_model(s.source, load));
  s.load_s = std::chrono::duration<double>(Clock::now() - start).count();
  if (settle) {
    settle();
  }
  if (s.model->device().is_cpu() && load.switches.thread_choice) {
    // Before the runs, in the thread that will run them (OpenMP's threads are per thread).
    start = Clock::now();
    s.threads_report = choose_cpu_threads(*s.model).report;
    s.load_s += std::chrono::duration<double>(Clock::now() - start).count();
  }
  s.config_json = base::dump_json_lossy(model::to_json(s.model->config()), 2);
  load.progress = nullptr;
  load.cancel = nullptr;
  load.free_memory = nullptr;
  s.load = std::move(load);
}

}  // namespace

base::Result<Inputs> prepare(const model::ModelSource& source, const Prompt& prompt,
                             const generation::GenerationOverrides& overrides) {
  return base::guarded([&]() -> Inputs {
    // Without a tokenizer, ids are enough; the error of reading one otherwise explains.
    auto tokenizer = tokenizer_for(source);
    if (!tokenizer.ok() &&
        (prompt.ids.empty() || tokenizer.error().code != ErrorCode::FileNotFound)) {
      throw base::ErrorException(tokenizer.error());
    }
    return inputs_with(tokenizer.ok() ? std::move(tokenizer).value() : nullptr, source, prompt,
                       overrides);
  });
}

base::Result<Inputs> Session::prepare(const Prompt& prompt,
                                      const generation::GenerationOverrides& overrides) const {
  return base::guarded([&]() -> Inputs {
    Inputs in = inputs_with(tokenizer, source, prompt, overrides);
    check_vocabulary(in.prompt_ids, *model);
    return in;
  });
}

namespace {

// `tokens` prompt tokens and the canvases of `in` must fit the model's positions.
void check_context(std::int64_t tokens, const std::string& what, const Inputs& in,
                   const model::ModelConfig& config) {
  const std::int64_t c = config.canvas_length;
  const std::int64_t canvases = (in.generation.max_new_tokens + c - 1) / c;
  const std::int64_t limit = config.text.max_position_embeddings;
  if (tokens + canvases * c > limit) {
    base::raise(base::ErrorCode::InvalidArgument,
                what + " is too long for the model's context: " + std::to_string(tokens) +
                    " tokens and " + std::to_string(canvases) + " canvases of " +
                    std::to_string(c) + " make more than its " + std::to_string(limit) +
                    " positions");
  }
}

}  // namespace

base::Result<std::vector<std::vector<std::int64_t>>> Session::prepare_companions(
    const std::vector<Prompt>& companions, const Inputs& inputs,
    const generation::GenerationOverrides& overrides) const {
  return base::guarded([&]() -> std::vector<std::vector<std::int64_t>> {
    const model::ModelConfig& config = model->config();
    check_context(static_cast<std::int64_t>(inputs.prompt_ids.size()), "the prompt", inputs,
                  config);
    std::vector<std::vector<std::int64_t>> ids;
    for (std::size_t i = 0; i < companions.size(); ++i) {
      const std::string what = "companion " + std::to_string(i + 1);
      auto one = prepare(companions[i], overrides);
      if (!one.ok()) {
        base::raise(one.error().code, what + ": " + one.error().message);
      }
      check_context(static_cast<std::int64_t>(one.value().prompt_ids.size()), what, inputs, config);
      ids.push_back(std::move(one.value().prompt_ids));
    }
    return ids;
  });
}

base::Result<Session> open_model(const model::ModelSource& source, model::LoadOptions load) {
  return base::guarded([&]() -> Session {
    Session s;
    s.source = source;
    const auto start = std::chrono::steady_clock::now();
    s.tokenizer = optional_tokenizer(source);
    s.prepare_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    load_into(s, std::move(load));
    return s;
  });
}

namespace {

// At most one token per byte of the text the tokenizer reads (a byte-level piece, a byte
// fallback and an unknown piece each cover at least one), and the few it adds.
std::int64_t prompt_token_bound(const Prompt& prompt) {
  if (!prompt.ids.empty()) {
    return static_cast<std::int64_t>(prompt.ids.size());
  }
  const std::size_t bytes =
      prompt.chat_template ? text::chat_prompt(prompt.text).size() : prompt.text.size();
  return static_cast<std::int64_t>(bytes) + 8;
}

}  // namespace

base::Result<Session> open_session(const model::ModelSource& source, model::LoadOptions load,
                                   const Prompt& prompt,
                                   const generation::GenerationOverrides& overrides) {
  return base::guarded([&]() -> Session {
    Session s;
    s.source = source;
    // The tokenizer and the prompt's ids (a preset's 262,144 pieces: half a second, issue #37)
    // are made on a thread of their own while the model loads. The load's memory check takes
    // the prompt's length from above; a prompt that cannot be read stops the load, and its
    // error is the one reported.
    load.workload.new_tokens = take(generation_config_for(source, overrides)).max_new_tokens;
    load.workload.prompt_tokens = prompt_token_bound(prompt);
    base::CancelToken stop(load.cancel);
    load.cancel = &stop;
    std::future<base::Result<Inputs>> pending = std::async(std::launch::async, [&] {
      const auto start = std::chrono::steady_clock::now();
      auto in = prepare(source, prompt, overrides);
      s.prepare_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!in.ok()) {
        stop.cancel();
      }
      return in;
    });
    const auto loaded = base::guarded([&] {
      load_into(s, std::move(load), [&] { pending.wait(); });
      return true;
    });
    s.inputs = take(pending.get());
    if (!loaded.ok()) {
      throw base::ErrorException(loaded.error());
    }
    s.tokenizer = s.inputs.tokenizer;
    check_vocabulary(s.inputs.prompt_ids, *s.model);
    return s;
  });
}

}  // namespace batchlens::setup
