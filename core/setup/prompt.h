// SPDX-License-Identifier: Apache-2.0
// A prompt as every caller names it (text through the chat template, or exact ids), its JSON
// form, and files of prompts (a sweep's prompts, an experiment's companions). Torch-free.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/base/error.h"

namespace batchlens::setup {

/// The prompt: text (through the Gemma chat template unless `chat_template` is false), or token
/// ids, which win when set.
struct Prompt {
  std::string text;
  bool chat_template = true;
  std::vector<std::int64_t> ids;
};

/// {"prompt": text, "chat_template": bool, "prompt_ids": [...] when set}.
nlohmann::json to_json(const Prompt& prompt);
/// The inverse of to_json; FileCorrupted naming `where` for a missing or mistyped field or more
/// than 1,000,000 ids. Never throws.
base::Result<Prompt> prompt_from_json(const nlohmann::json& doc, const std::string& where);

/// Prompts from a file: JSON Lines (every non-empty line an object with "prompt" or
/// "prompt_ids", optional "chat_template") when the first non-empty line starts with '{', else
/// one prompt per non-empty line. `what` names the file in messages ("prompt file",
/// "companions file"). InvalidArgument naming the line for bad lines (invalid UTF-8, a line over
/// 1 MiB, bad JSON) and for a file without prompts; the file is refused before it is read when
/// it is over 64 MiB or no regular file; at most 100000 prompts. Never throws.
base::Result<std::vector<Prompt>> read_prompts(const std::filesystem::path& path,
                                               std::string_view what = "prompt file");

/// At most this many prompts in a file or a spec.
inline constexpr std::size_t kMaxPrompts = 100000;

}  // namespace batchlens::setup
