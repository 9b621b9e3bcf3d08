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

// `base` with one value of each of the axes of a mixed batch, as its items run it.
ExperimentSpec with_axes(const ExperimentSpec& base, const std::vector<setup::Prompt>& companions,
                         std::int64_t row) {
  ExperimentSpec s = base;
  s.composition.companions = companions;
  s.composition.row = row;
  if (!s.composition.mixed()) {
    // Identical rows (the axis value "none") have no padding: per-row positions are the shared
    // ones, and an experiment spec says so (validate refuses per_row without companions).
    s.composition.positions = generation::PositionMode::Shared;
  }
  if (s.composition.mixed() && s.prefill == generation::PrefillMode::Copied) {
    s.prefill = generation::PrefillMode::Batched;  // a batch of different prompts, as `run`
  }
  return s;
}

}  // namespace

bool SweepSpec::mixed() const {
  return companion_sets.size() > 1 || rows.size() > 1 ||
         (companion_sets.size() == 1 && !companion_sets.front().empty()) ||
         (rows.size() == 1 && rows.front() != 0);
}

void SweepSpec::normalize_axes() {
  experiment::Composition& c = base.composition;
  if (companion_sets.size() == 1 && companion_sets.front().empty() && !c.companions.empty()) {
    companion_sets.front() = c.companions;
  }
  if (rows.size() == 1 && rows.front() == 0 && c.row != 0) {
    rows.front() = c.row;
  }
  c.companions.clear();
  c.row = 0;
}

base::Result<void> validate(const SweepSpec& spec) {
  // The base spec is checked below with every value of the axes (its own composition holds no
  // companions once normalize_axes moved them into the axes: alone, per_row positions would be
  // refused although every item has companions).
  if (spec.companion_sets.empty() || spec.rows.empty() || spec.companion_sets.size() > 1000 ||
      spec.rows.size() > 1000) {
    return base::Error{ErrorCode::InvalidArgument,
                       "a sweep needs 1 to 1000 sets of companions and 1 to 1000 rows"};
  }
  // Every value of the axes as the experiment spec of its items checks it (a row outside the
  // smallest batch, a bad companion).
  for (const auto& set : spec.companion_sets) {
    for (const std::int64_t row : spec.rows) {
      if (auto v = validate(with_axes(spec.base, set, row)); !v.ok()) {
        return v;
      }
    }
  }
  if (spec.prompts.empty()) {
    return base::Error{ErrorCode::InvalidArgument, "a sweep needs at least one prompt"};
  }
  if (spec.seeds.empty()) {
    return base::Error{ErrorCode::InvalidArgument, "a sweep needs at least one seed"};
  }
  if (spec.prompts.size() > kMaxPrompts || spec.seeds.size() > kMaxSeeds ||
      spec.prompts.size() * spec.seeds.size() * spec.companion_sets.size() * spec.rows.size() >
          kMaxItems) {
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
  json out = {{"base", to_json(spec.base)}, {"prompts", prompts}, {"seeds", spec.seeds}};
  if (spec.mixed()) {  // only then: a sweep without the axes keeps its id
    json sets = json::array();
    for (const auto& set : spec.companion_sets) {
      json one = json::array();
      for (const setup::Prompt& p : set) {
        one.push_back(setup::to_json(p));
      }
      sets.push_back(std::move(one));
    }
    out["companion_sets"] = std::move(sets);
    out["rows"] = spec.rows;
    // The base spec's JSON keeps its composition only with companions, which are the axis here:
    // per_row positions are kept beside it (shared, the default, adds nothing: the ids of the
    // sweeps recorded before stay).
    if (spec.base.composition.positions != generation::PositionMode::Shared) {
      out["positions"] = generation::name(spec.base.composition.positions);
    }
  }
  return out;
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
    if (doc.contains("companion_sets") || doc.contains("rows")) {
      const json* sets = doc.contains("companion_sets") ? &doc.at("companion_sets") : nullptr;
      const json* rows = doc.contains("rows") ? &doc.at("rows") : nullptr;
      if (sets == nullptr || rows == nullptr || !sets->is_array() || sets->size() > 1000 ||
          !rows->is_array() || rows->size() > 1000) {
        base::corrupt(where +
                      ": 'companion_sets' and 'rows' must both be arrays of at most 1000 "
                      "entries");
      }
      s.companion_sets.clear();
      for (const json& set : *sets) {
        if (!set.is_array() || set.size() > kMaxPrompts) {
          base::corrupt(where + ": a set of companions is not an array of prompts");
        }
        std::vector<setup::Prompt> one;
        for (const json& p : set) {
          one.push_back(base::take(setup::prompt_from_json(p, where)));
        }
        s.companion_sets.push_back(std::move(one));
      }
      s.rows.clear();
      for (const json& x : *rows) {
        if (!x.is_number_integer() || x.get<std::int64_t>() < 0 ||
            x.get<std::int64_t>() > 1000000) {
          base::corrupt(where + ": a row is not a non-negative integer");
        }
        s.rows.push_back(x.get<std::int64_t>());
      }
    }
    if (doc.contains("positions")) {
      if (!doc.at("positions").is_string()) {
        base::corrupt(where + ": 'positions' is not a string");
      }
      auto mode = generation::parse_position_mode(doc.at("positions").get<std::string>());
      if (!mode.ok()) {
        base::corrupt(where + ": 'positions' is not shared or per_row");
      }
      s.base.composition.positions = mode.value();
    }
    s.normalize_axes();  // a spec of last session's format: its companions are the axis
    return s;
  });
}

std::string sweep_id(const SweepSpec& spec) {
  const std::string text = base::dump_json_lossy(to_json(spec));
  return base::sha256_hex(text.data(), text.size()).substr(0, 16);
}

std::vector<SweepItem> sweep_items(const SweepSpec& spec) {
  std::vector<SweepItem> out;
  out.reserve(spec.prompts.size() * spec.seeds.size() * spec.companion_sets.size() *
              spec.rows.size());
  for (std::size_t p = 0; p < spec.prompts.size(); ++p) {
    for (const std::uint64_t seed : spec.seeds) {
      for (std::size_t c = 0; c < spec.companion_sets.size(); ++c) {
        for (const std::int64_t row : spec.rows) {
          out.push_back(
              {static_cast<int>(out.size()), static_cast<int>(p), seed, static_cast<int>(c), row});
        }
      }
    }
  }
  return out;
}

ExperimentSpec item_spec(const SweepSpec& spec, const SweepItem& item) {
  ExperimentSpec s = with_axes(
      spec.base, spec.companion_sets.at(static_cast<std::size_t>(item.companions)), item.row);
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

base::Result<SweepSpec> sweep_from_input(const SweepInput& in) {
  return base::guarded([&] {
    SweepSpec sweep;
    sweep.base = in.base;
    const experiment::ExperimentSpec& b = sweep.base;
    if (!in.prompts_file.empty()) {
      sweep.prompts = base::take(setup::read_prompts(in.prompts_file));
    } else {
      sweep.prompts = {{b.prompt, b.chat_template, b.prompt_ids}};
    }
    sweep.seeds = {b.seed};
    if (!in.seeds.empty()) {
      sweep.seeds = base::take(parse_seeds(in.seeds));
    }
    sweep.normalize_axes();  // the spec's companions and row: one value of each axis
    if (!in.companion_sets.empty()) {
      sweep.companion_sets.clear();
      std::stringstream parts(in.companion_sets);
      std::string part;
      while (std::getline(parts, part, ',')) {
        if (part == "none") {
          sweep.companion_sets.emplace_back();
        } else {
          sweep.companion_sets.push_back(base::take(setup::read_prompts(part, "companions file")));
        }
      }
    }
    if (!in.rows.empty()) {
      std::vector<std::int64_t> rows;
      std::stringstream parts(in.rows);
      std::string part;
      while (std::getline(parts, part, ',')) {
        std::size_t used = 0;
        long long row = -1;
        try {
          row = std::stoll(part, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != part.size() || row < 0) {
          base::raise(ErrorCode::InvalidArgument,
                      "rows: '" + part + "' is not a row (a list such as 0,3)");
        }
        rows.push_back(row);
      }
      if (rows.empty()) {
        base::raise(ErrorCode::InvalidArgument, "rows: '" + in.rows + "' holds no row");
      }
      sweep.rows = rows;
    }
    base::take(validate(sweep));
    return sweep;
  });
}

}  // namespace batchlens::analysis
