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

constexpr std::size_t kMaxItems = 1000000;
using setup::kMaxPrompts;
constexpr std::size_t kMaxSeeds = 100000;

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
    const setup::Prompt& p = spec.prompts[i];
    if (p.ids.empty() && p.text.empty()) {
      return base::Error{ErrorCode::InvalidArgument,
                         "prompt " + std::to_string(i + 1) + " is empty"};
    }
  }
  return base::ok_result();
}

json to_json(const SweepSpec& spec) {
  json prompts = json::array();
  for (const setup::Prompt& p : spec.prompts) {
    prompts.push_back(setup::to_json(p));
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
      s.prompts.push_back(base::take(setup::prompt_from_json(p, where)));
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
  const setup::Prompt& p = spec.prompts.at(static_cast<std::size_t>(item.prompt));
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

}  // namespace batchlens::analysis
