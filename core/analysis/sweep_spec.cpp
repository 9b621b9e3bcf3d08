// SPDX-License-Identifier: Apache-2.0
#include "core/analysis/sweep_spec.h"

#include <algorithm>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/base/input.h"
#include "core/base/json_field.h"
#include "core/base/sha256.h"

namespace batchlens::analysis {

using experiment::ExperimentSpec;

namespace {

using base::ErrorCode;
using nlohmann::json;
namespace fs = std::filesystem;

constexpr std::size_t kMaxItems = 1000000;
constexpr std::size_t kMaxPrompts = 100000;
constexpr std::size_t kMaxSeeds = 100000;
constexpr std::size_t kMaxPromptBytes = std::size_t{1} << 20;
// A prompt file whole: 100,000 prompts of a few hundred bytes fit; a 100 MB line is refused
// before it is read.
constexpr std::uint64_t kMaxPromptFileBytes = std::uint64_t{64} << 20;

}  // namespace

base::Result<void> validate(const SweepSpec& spec) {
  if (auto v = validate(spec.base); !v.ok()) {
    return v;
  }
  if (spec.prompts.empty()) {
    return base::Error{ErrorCode::InvalidArgument, "a sweep needs at least one prompt"};
  }
  if (spec.seeds.empty()) {
    return base::Error{ErrorCode::InvalidArgument, "a sweep needs at least one seed"};
  }
  if (spec.prompts.size() > kMaxPrompts || spec.seeds.size() > kMaxSeeds ||
      spec.prompts.size() * spec.seeds.size() > kMaxItems) {
    return base::Error{ErrorCode::InvalidArgument, "a sweep has at most " +
                                                       std::to_string(kMaxItems) + " items (" +
                                                       std::to_string(kMaxPrompts) + " prompts, " +
                                                       std::to_string(kMaxSeeds) + " seeds)"};
  }
  for (std::size_t i = 0; i < spec.prompts.size(); ++i) {
    const SweepPrompt& p = spec.prompts[i];
    if (p.ids.empty() && p.text.empty()) {
      return base::Error{ErrorCode::InvalidArgument,
                         "prompt " + std::to_string(i + 1) + " is empty"};
    }
  }
  return base::ok_result();
}

json to_json(const SweepSpec& spec) {
  json prompts = json::array();
  for (const SweepPrompt& p : spec.prompts) {
    json j = {{"prompt", p.text}, {"chat_template", p.chat_template}};
    if (!p.ids.empty()) {
      j["prompt_ids"] = p.ids;
    }
    prompts.push_back(std::move(j));
  }
  return {{"base", to_json(spec.base)}, {"prompts", prompts}, {"seeds", spec.seeds}};
}

base::Result<SweepSpec> sweep_spec_from_json(const json& doc) {
  return base::guarded([&]() -> SweepSpec {
    const std::string where = "sweep spec";
    if (!doc.is_object() || !doc.contains("base") || !doc.contains("prompts") ||
        !doc.contains("seeds")) {
      base::corrupt(where + ": needs 'base', 'prompts' and 'seeds'");
    }
    SweepSpec s;
    s.base = base::take(experiment::spec_from_json(doc.at("base")));
    const json& prompts = doc.at("prompts");
    const json& seeds = doc.at("seeds");
    if (!prompts.is_array() || prompts.size() > kMaxPrompts || !seeds.is_array() ||
        seeds.size() > kMaxSeeds) {
      base::corrupt(where + ": 'prompts' and 'seeds' must be arrays of at most " +
                    std::to_string(kMaxPrompts) + " entries");
    }
    for (const json& p : prompts) {
      if (!p.is_object()) {
        base::corrupt(where + ": a prompt is not an object");
      }
      SweepPrompt sp;
      sp.text = base::json_field<std::string>(p, "prompt", where);
      sp.chat_template = base::json_field<bool>(p, "chat_template", where);
      if (const auto ids = p.find("prompt_ids"); ids != p.end()) {
        if (!ids->is_array() || ids->size() > 1000000) {
          base::corrupt(where + ": 'prompt_ids' is not an array");
        }
        for (const json& id : *ids) {
          if (!id.is_number_integer()) {
            base::corrupt(where + ": a prompt id is not an integer");
          }
          sp.ids.push_back(id.get<std::int64_t>());
        }
      }
      s.prompts.push_back(std::move(sp));
    }
    s.seeds.clear();
    for (const json& x : seeds) {
      if (!x.is_number_unsigned()) {
        base::corrupt(where + ": a seed is not a non-negative integer");
      }
      s.seeds.push_back(x.get<std::uint64_t>());
    }
    return s;
  });
}

std::string sweep_id(const SweepSpec& spec) {
  const std::string text = base::dump_json_lossy(to_json(spec));
  return base::sha256_hex(text.data(), text.size()).substr(0, 16);
}

std::vector<SweepItem> sweep_items(const SweepSpec& spec) {
  std::vector<SweepItem> out;
  out.reserve(spec.prompts.size() * spec.seeds.size());
  for (std::size_t p = 0; p < spec.prompts.size(); ++p) {
    for (const std::uint64_t seed : spec.seeds) {
      out.push_back({static_cast<int>(out.size()), static_cast<int>(p), seed});
    }
  }
  return out;
}

ExperimentSpec item_spec(const SweepSpec& spec, const SweepItem& item) {
  ExperimentSpec s = spec.base;
  const SweepPrompt& p = spec.prompts.at(static_cast<std::size_t>(item.prompt));
  s.prompt = p.text;
  s.chat_template = p.chat_template;
  s.prompt_ids = p.ids;
  s.seed = item.seed;
  s.repeats = 0;
  s.kernels = false;
  return s;
}

bool in_shard(const SweepItem& item, const Shard& shard) {
  return shard.count <= 1 || item.index % shard.count == shard.index;
}

base::Result<std::vector<std::uint64_t>> parse_seeds(const std::string& text) {
  return base::guarded([&] {
    std::set<std::uint64_t> seeds;
    std::stringstream in(text);
    std::string part;
    const auto number = [&](const std::string& s) -> std::uint64_t {
      if (s.empty() || s.size() > 19 ||
          !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        base::raise(ErrorCode::InvalidArgument,
                    "seeds: '" + s + "' is not a number (e.g. 0-23 or 0,5,9-11)");
      }
      return std::stoull(s);
    };
    while (std::getline(in, part, ',')) {
      const std::size_t dash = part.find('-');
      const std::uint64_t lo = number(part.substr(0, dash));
      const std::uint64_t hi = dash == std::string::npos ? lo : number(part.substr(dash + 1));
      if (hi < lo || hi - lo >= kMaxSeeds || seeds.size() + (hi - lo) >= kMaxSeeds) {
        base::raise(ErrorCode::InvalidArgument, "seeds: '" + part + "' is empty or more than " +
                                                    std::to_string(kMaxSeeds) + " seeds");
      }
      for (std::uint64_t s = lo; s <= hi; ++s) {
        seeds.insert(s);
      }
    }
    if (seeds.empty()) {
      base::raise(ErrorCode::InvalidArgument, "seeds: none given (e.g. 0-23)");
    }
    return std::vector<std::uint64_t>(seeds.begin(), seeds.end());
  });
}

base::Result<std::vector<SweepPrompt>> read_prompts(const fs::path& path) {
  return base::guarded([&] {
    // A FIFO, device or folder is refused before any read (it blocked forever, issue #32).
    std::istringstream in(
        base::take(base::read_input_file(path, "prompt file", kMaxPromptFileBytes)));
    std::vector<SweepPrompt> out;
    std::string line;
    int number = 0;
    int jsonl = -1;  // unknown until the first non-empty line
    while (std::getline(in, line)) {
      ++number;
      const std::string where = path.string() + " line " + std::to_string(number);
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
      SweepPrompt p;
      if (jsonl == 1) {
        const json j = base::take(base::parse_json(line, where));
        if (!j.is_object() || (!j.contains("prompt") && !j.contains("prompt_ids"))) {
          base::raise(ErrorCode::InvalidArgument, where + R"(: needs "prompt" or "prompt_ids")");
        }
        if (j.contains("prompt")) {
          if (!j.at("prompt").is_string()) {
            base::raise(ErrorCode::InvalidArgument, where + R"(: "prompt" is not a string)");
          }
          p.text = j.at("prompt").get<std::string>();
        }
        if (j.contains("prompt_ids")) {
          const json& ids = j.at("prompt_ids");
          if (!ids.is_array() || ids.empty() ||
              !std::all_of(ids.begin(), ids.end(),
                           [](const json& x) { return x.is_number_integer(); })) {
            base::raise(ErrorCode::InvalidArgument,
                        where + R"(: "prompt_ids" is not a list of integers)");
          }
          p.ids = ids.get<std::vector<std::int64_t>>();
        }
        if (j.contains("chat_template")) {
          if (!j.at("chat_template").is_boolean()) {
            base::raise(ErrorCode::InvalidArgument,
                        where + R"(: "chat_template" is not true/false)");
          }
          p.chat_template = j.at("chat_template").get<bool>();
        }
      } else {
        p.text = line;
      }
      if (out.size() == kMaxPrompts) {
        base::raise(ErrorCode::InvalidArgument,
                    path.string() + " has more than " + std::to_string(kMaxPrompts) + " prompts");
      }
      out.push_back(std::move(p));
    }
    if (out.empty()) {
      base::raise(ErrorCode::InvalidArgument, path.string() + " holds no prompt");
    }
    return out;
  });
}

}  // namespace batchlens::analysis
