// SPDX-License-Identifier: Apache-2.0
#include "core/text/model_text.h"

#include <map>
#include <mutex>

#include "core/model/config.h"
#include "core/text/tokenizer_builder.h"

namespace batchlens::text {

base::Result<Tokenizer> tokenizer_for(const model::ModelSource& source) {
  if (!source.checkpoint_dir.empty()) {
    const auto path = source.checkpoint_dir / "tokenizer.json";
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      return base::Error{base::ErrorCode::FileNotFound, "no tokenizer.json in " +
                                                            source.checkpoint_dir.string() +
                                                            ": give the prompt as token ids"};
    }
    return Tokenizer::from_file(path);
  }
  auto config = model::load_preset(source.preset);
  if (!config.ok()) {
    return config.error();
  }
  const std::int64_t vocab = config.value().text.vocab_size;
  static std::mutex mutex;
  static std::map<std::int64_t, Tokenizer> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(vocab); it != cache.end()) {
    return it->second;
  }
  auto json = preset_tokenizer_json(vocab);
  if (!json.ok()) {
    return json.error();
  }
  auto tokenizer = Tokenizer::from_json(json.value());
  if (tokenizer.ok()) {
    cache.emplace(vocab, tokenizer.value());
  }
  return tokenizer;
}

}  // namespace batchlens::text
