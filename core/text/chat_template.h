// SPDX-License-Identifier: Apache-2.0
// The Gemma 4 chat template that DiffusionGemma's tokenizer ships (chat_template.jinja), for
// one user message, as the reference's integration tests apply it. Torch-free.
#pragma once

#include <string>
#include <string_view>

namespace batchlens::text {

struct ChatOptions {
  bool thinking = false;  ///< enable_thinking: a system turn with <|think|>, no empty thought
  std::string system;     ///< optional system prompt
};

/// The prompt text for `user_message` (trimmed), ending where the model's answer starts:
/// "<bos><|turn>user\n{message}<turn|>\n<|turn>model\n<|channel>thought\n<channel|>" without
/// thinking. Encode it with Tokenizer::encode (the special tokens are matched there).
/// ref: spec §8, the HF integration test's apply_chat_template(..., add_generation_prompt=True)
std::string chat_prompt(std::string_view user_message, const ChatOptions& options = {});

}  // namespace batchlens::text
