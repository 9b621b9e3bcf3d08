// SPDX-License-Identifier: Apache-2.0
#include "core/ops/policy.h"

#include <fstream>

namespace batchlens::ops {

std::string_view strategy_name(Strategy strategy) {
  switch (strategy) {
    case Strategy::Batched:
      return "batched";
    case Strategy::RowWise:
      return "row_wise";
  }
  return "unknown";
}

bool PolicyRule::matches(OpFamily family, int layer) const {
  if (!families.test(static_cast<std::size_t>(family))) {
    return false;
  }
  if (!family_is_per_layer(family)) {
    return true;
  }
  return layer >= first_layer && (last_layer < 0 || layer <= last_layer);
}

Strategy OpPolicy::resolve(OpFamily family, int layer) const {
  Strategy s = Strategy::Batched;
  for (const auto& rule : rules) {
    if (rule.matches(family, layer)) {
      s = rule.strategy;
    }
  }
  return s;
}

OpPolicy OpPolicy::default_policy() {
  return OpPolicy{};
}

OpPolicy OpPolicy::row_wise(FamilySet families, std::string name) {
  OpPolicy p;
  p.name = std::move(name);
  p.rules.push_back(PolicyRule{families, 0, -1, Strategy::RowWise});
  return p;
}

OpPolicy OpPolicy::row_wise_all() {
  return row_wise(FamilySet().set(), "row_wise_all");
}

OpPolicy OpPolicy::issue_workaround() {
  FamilySet f;
  f.set(static_cast<std::size_t>(OpFamily::RouterProj));
  f.set(static_cast<std::size_t>(OpFamily::SelfCondMatmul));
  return row_wise(f, "issue_workaround");
}

base::Result<FamilySet> parse_families(const std::vector<std::string>& names) {
  FamilySet set;
  for (const auto& n : names) {
    const auto f = family_from_name(n);
    if (!f) {
      std::string known;
      for (OpFamily k : all_families()) {
        known += (known.empty() ? "" : ", ") + std::string(family_name(k));
      }
      std::string message = "unknown op family '" + n + "' (known: ";
      message += known;
      message += ")";
      return base::Error{base::ErrorCode::InvalidArgument, message};
    }
    set.set(static_cast<std::size_t>(*f));
  }
  return set;
}

namespace {

std::vector<std::string> family_names(const FamilySet& set) {
  std::vector<std::string> out;
  for (OpFamily f : all_families()) {
    if (set.test(static_cast<std::size_t>(f))) {
      out.emplace_back(family_name(f));
    }
  }
  return out;
}

}  // namespace

nlohmann::json to_json(const OpPolicy& policy) {
  nlohmann::json rules = nlohmann::json::array();
  for (const auto& r : policy.rules) {
    rules.push_back({{"families", family_names(r.families)},
                     {"first_layer", r.first_layer},
                     {"last_layer", r.last_layer},
                     {"strategy", std::string(strategy_name(r.strategy))}});
  }
  return {{"name", policy.name}, {"rules", rules}};
}

base::Result<OpPolicy> policy_from_json(const nlohmann::json& doc) {
  const auto bad = [](const std::string& what) {
    return base::Error{base::ErrorCode::InvalidArgument, "op policy: " + what};
  };
  if (!doc.is_object() || !doc.contains("rules") || !doc["rules"].is_array()) {
    return bad("expected an object with a \"rules\" array");
  }
  OpPolicy p;
  if (doc.contains("name") && doc["name"].is_string()) {
    p.name = doc["name"].get<std::string>();
  }
  for (const auto& r : doc["rules"]) {
    if (!r.is_object() || !r.contains("families") || !r["families"].is_array()) {
      return bad("each rule needs a \"families\" array");
    }
    std::vector<std::string> names;
    for (const auto& n : r["families"]) {
      if (!n.is_string()) {
        return bad("family names must be strings");
      }
      names.push_back(n.get<std::string>());
    }
    auto families = parse_families(names);
    if (!families.ok()) {
      return families.error();
    }
    PolicyRule rule;
    rule.families = families.value();
    if (r.contains("first_layer")) {
      if (!r["first_layer"].is_number_integer()) {
        return bad("first_layer must be an integer");
      }
      rule.first_layer = r["first_layer"].get<int>();
    }
    if (r.contains("last_layer")) {
      if (!r["last_layer"].is_number_integer()) {
        return bad("last_layer must be an integer");
      }
      rule.last_layer = r["last_layer"].get<int>();
    }
    const std::string strategy = r.value("strategy", std::string("row_wise"));
    if (strategy == "row_wise") {
      rule.strategy = Strategy::RowWise;
    } else if (strategy == "batched") {
      rule.strategy = Strategy::Batched;
    } else {
      return bad("unknown strategy '" + strategy + "' (known: batched, row_wise)");
    }
    p.rules.push_back(rule);
  }
  return p;
}

base::Result<OpPolicy> policy_by_name(const std::string& name_or_file) {
  if (name_or_file == "default") {
    return OpPolicy::default_policy();
  }
  if (name_or_file == "issue_workaround") {
    return OpPolicy::issue_workaround();
  }
  if (name_or_file == "row_wise_all") {
    return OpPolicy::row_wise_all();
  }
  std::ifstream in(name_or_file);
  if (!in) {
    return base::Error{base::ErrorCode::InvalidArgument,
                       "policy '" + name_or_file +
                           "': expected default, issue_workaround, row_wise_all or a JSON file"};
  }
  const auto doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return base::Error{base::ErrorCode::InvalidArgument,
                       "policy file '" + name_or_file + "' is not valid JSON"};
  }
  return policy_from_json(doc);
}

std::string describe(const OpPolicy& policy) {
  if (policy.rules.empty()) {
    return policy.name + ": every op batched";
  }
  std::string out = policy.name + ":";
  for (const auto& r : policy.rules) {
    out += " " + std::string(strategy_name(r.strategy)) + " {";
    const auto names = family_names(r.families);
    for (std::size_t i = 0; i < names.size(); ++i) {
      out += (i > 0 ? ", " : "");
      out += names[i];
    }
    out += "}";
    if (r.first_layer != 0 || r.last_layer >= 0) {
      out += " layers " + std::to_string(r.first_layer) + ".." +
             (r.last_layer < 0 ? std::string("last") : std::to_string(r.last_layer));
    }
  }
  return out;
}

}  // namespace batchlens::ops
