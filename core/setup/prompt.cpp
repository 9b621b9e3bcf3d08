// SPDX-License-Identifier: Apache-2.0
#include "core/setup/prompt.h"

#include <algorithm>
#include <sstream>

#include "core/base/input.h"
#include "core/base/json_field.h"

namespace batchlens::setup {

namespace {

using base::ErrorCode;
using nlohmann::json;

constexpr std::size_t kMaxPromptBytes = std::size_t{1} << 20;
constexpr std::size_t kMaxPromptIds = 1000000;
// A prompt file whole: 100,000 prompts of a few hundred bytes fit; a 100 MB line is refused
// before it is read.
constexpr std::uint64_t kMaxPromptFileBytes = std::uint64_t{64} << 20;

// One JSON Lines entry: {"prompt": ..., "prompt_ids": [...], "chat_template": ...}.
Prompt prompt_of_line(const std::string& line, const std::string& where) {
  const json j = base::take(base::parse_json(line, where));
  if (!j.is_object() || (!j.contains("prompt") && !j.contains("prompt_ids"))) {
    base::raise(ErrorCode::InvalidArgument, where + R"(: needs "prompt" or "prompt_ids")");
  }
  Prompt p;
  if (j.contains("prompt")) {
    if (!j.at("prompt").is_string()) {
      base::raise(ErrorCode::InvalidArgument, where + R"(: "prompt" is not a string)");
    }
    p.text = j.at("prompt").get<std::string>();
  }
  if (j.contains("prompt_ids")) {
    const json& ids = j.at("prompt_ids");
    if (!ids.is_array() || ids.empty() ||
        !std::all_of(ids.begin(), ids.end(), [](const json& x) { return x.is_number_integer(); })) {
      base::raise(ErrorCode::InvalidArgument,
                  where + R"(: "prompt_ids" is not a list of integers)");
    }
    p.ids = ids.get<std::vector<std::int64_t>>();
  }
  if (j.contains("chat_template")) {
    if (!j.at("chat_template").is_boolean()) {
      base::raise(ErrorCode::InvalidArgument, where + R"(: "chat_template" is not true/false)");
    }
    p.chat_template = j.at("chat_template").get<bool>();
  }
  return p;
}

}  // namespace

json to_json(const Prompt& prompt) {
  json j = {{"prompt", prompt.text}, {"chat_template", prompt.chat_template}};
  if (!prompt.ids.empty()) {
    j["prompt_ids"] = prompt.ids;
  }
  return j;
}

base::Result<Prompt> prompt_from_json(const json& doc, const std::string& where) {
  return base::guarded([&]() -> Prompt {
    if (!doc.is_object()) {
      base::corrupt(where + ": a prompt is not an object");
    }
    Prompt p;
    p.text = base::json_field<std::string>(doc, "prompt", where);
    p.chat_template = base::json_field<bool>(doc, "chat_template", where);
    if (const auto ids = doc.find("prompt_ids"); ids != doc.end()) {
      if (!ids->is_array() || ids->size() > kMaxPromptIds) {
        base::corrupt(where + ": 'prompt_ids' is not an array");
      }
      for (const json& id : *ids) {
        if (!id.is_number_integer()) {
          base::corrupt(where + ": a prompt id is not an integer");
        }
        p.ids.push_back(id.get<std::int64_t>());
      }
    }
    return p;
  });
}

base::Result<std::vector<Prompt>> read_prompts(const std::filesystem::path& path,
                                               std::string_view what) {
  return base::guarded([&] {
    // A FIFO, device or folder is refused before any read (it blocked forever, issue #32).
    std::istringstream in(
        base::take(base::read_input_file(path, std::string(what), kMaxPromptFileBytes)));
    std::vector<Prompt> out;
    std::string line;
    int number = 0;
    int jsonl = -1;  // unknown until the first non-empty line
    while (std::getline(in, line)) {
      ++number;
      const std::string where =
          std::string(what) + " " + path.string() + " line " + std::to_string(number);
      if (!line.empty() && line.back() == '\r') {
        line.pop_back();
      }
      if (line.find_first_not_of(" \t") == std::string::npos) {
        continue;
      }
      if (line.size() > kMaxPromptBytes) {
        base::raise(ErrorCode::InvalidArgument, where + " is longer than 1 MiB");
      }
      base::take(base::check_utf8(line, where));
      if (jsonl < 0) {
        jsonl = line[line.find_first_not_of(" \t")] == '{' ? 1 : 0;
      }
      if (out.size() == kMaxPrompts) {
        base::raise(ErrorCode::InvalidArgument, std::string(what) + " " + path.string() +
                                                    " has more than " +
                                                    std::to_string(kMaxPrompts) + " prompts");
      }
      out.push_back(jsonl == 1 ? prompt_of_line(line, where) : Prompt{line, true, {}});
    }
    if (out.empty()) {
      base::raise(ErrorCode::InvalidArgument,
                  std::string(what) + " " + path.string() + " holds no prompt");
    }
    return out;
  });
}

}  // namespace batchlens::setup
