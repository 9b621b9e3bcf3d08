// SPDX-License-Identifier: Apache-2.0
#include "core/ops/policy.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/base/input.h"

namespace batchlens::ops {

std::string_view strategy_name(Strategy strategy) {
  switch (strategy) {
    case Strategy::Batched:
      return "batched";
    case Strategy::RowWise:
      return "row_wise";
    case Strategy::BatchInvariant:
      return "batch_invariant";
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

OpPolicy OpPolicy::batch_invariant(FamilySet families, std::string name) {
  OpPolicy p;
  p.name = std::move(name);
  p.rules.push_back(PolicyRule{families, 0, -1, Strategy::BatchInvariant});
  return p;
}

OpPolicy OpPolicy::batch_invariant_all() {
  return batch_invariant(FamilySet().set(), "batch_invariant");
}

FamilySet families_with(const OpPolicy& policy, Strategy strategy) {
  FamilySet f;
  for (const PolicyRule& r : policy.rules) {
    if (r.strategy == strategy) {
      f |= r.families;
    }
  }
  return f;
}

OpPolicy OpPolicy::issue_workaround() {
  FamilySet f;
  f.set(static_cast<std::size_t>(OpFamily::RouterProj));
  f.set(static_cast<std::size_t>(OpFamily::SelfCondMatmul));
  return row_wise(f, "issue_workaround");
}

OpPolicy OpPolicy::emulated_split_k() {
  return emulation_profile("emulated_split_k");
}

OpPolicy OpPolicy::emulation_profile(std::string_view name) {
  const EmulationProfile* profile = find_emulation_profile(name);
  if (profile == nullptr) {
    base::raise(base::ErrorCode::InvalidArgument,
                "unknown emulation profile '" + std::string(name) + "'");
  }
  OpPolicy p;
  p.name = std::string(profile->name);
  p.emulate_split_k = profile->families;
  return p;
}

const std::vector<EmulationProfile>& emulation_profiles() {
  static const std::vector<EmulationProfile> profiles = [] {
    const auto of = [](std::initializer_list<OpFamily> families) {
      FamilySet f;
      for (OpFamily family : families) {
        f.set(static_cast<std::size_t>(family));
      }
      return f;
    };
    return std::vector<EmulationProfile>{
        {"emulated_h200", of({OpFamily::SelfCondMatmul}), "NVIDIA H200",
         "split-K emulated in the self-conditioning matmul only: on the H200 it is the one op "
         "whose row 0 depends on the batch size (router projection, attention, MLP, experts "
         "and lm_head are batch invariant there)",
         "docs/findings/h200-issue7.md"},
        {"emulated_h100_report", of({OpFamily::RouterProj, OpFamily::SelfCondMatmul}),
         "NVIDIA H100",
         "split-K emulated in the router projection and the self-conditioning matmul: the two "
         "ops the original H100 report found diverging (and made row-wise as its workaround)",
         "docs/PRODUCT.md (the user's findings)"},
        {"emulated_split_k", gemm_families(), "no particular GPU",
         "split-K emulated in every GEMM family: a stress test, not any GPU's finding (the "
         "issue's workaround cannot fix it)",
         "ops::emulated_split_count"},
    };
  }();
  return profiles;
}

const EmulationProfile* find_emulation_profile(std::string_view name) {
  for (const EmulationProfile& p : emulation_profiles()) {
    if (p.name == name) {
      return &p;
    }
  }
  return nullptr;
}

FamilySet gemm_families() {
  FamilySet f;
  f.set();
  f.reset(static_cast<std::size_t>(OpFamily::Attention));
  return f;
}

OpPolicy combine(const OpPolicy& a, const OpPolicy& b) {
  OpPolicy p = a;
  if (a.is_default() && a.name == "default") {
    p.name = b.name;
  } else if (!(b.is_default() && b.name == "default")) {
    p.name = a.name + "+" + b.name;
  }
  p.rules.insert(p.rules.end(), b.rules.begin(), b.rules.end());
  p.emulate_split_k |= b.emulate_split_k;
  return p;
}

FamilySet family_set(std::initializer_list<OpFamily> families) {
  FamilySet f;
  for (const OpFamily family : families) {
    f.set(static_cast<std::size_t>(family));
  }
  return f;
}

std::string family_list(const FamilySet& families) {
  std::string out;
  for (int i = 0; i < kOpFamilyCount; ++i) {
    if (families.test(static_cast<std::size_t>(i))) {
      out += (out.empty() ? "" : ", ") + std::string(family_name(static_cast<OpFamily>(i)));
    }
  }
  return "{" + out + "}";
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

// A JSON array of family names.
base::Result<FamilySet> families_from_json(const nlohmann::json& names) {
  std::vector<std::string> out;
  for (const auto& n : names) {
    if (!n.is_string()) {
      return base::Error{base::ErrorCode::InvalidArgument,
                         "op policy: family names must be strings"};
    }
    out.push_back(n.get<std::string>());
  }
  return parse_families(out);
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
  return {{"name", policy.name},
          {"rules", rules},
          {"emulate_split_k", family_names(policy.emulate_split_k)}};
}

namespace {

// A layer index of a rule: -1 (first_layer: never used; last_layer: the last layer) up to a
// bound far above any model's depth.
constexpr int kMaxLayerIndex = 1 << 20;
bool fits_layer(const nlohmann::json& v) {
  if (v.is_number_unsigned()) {
    return v.get<std::uint64_t>() <= static_cast<std::uint64_t>(kMaxLayerIndex);
  }
  const auto i = v.get<std::int64_t>();
  return i >= -1 && i <= kMaxLayerIndex;
}

base::Result<OpPolicy> policy_from_json_or_throw(const nlohmann::json& doc) {
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
    auto families = families_from_json(r["families"]);
    if (!families.ok()) {
      return families.error();
    }
    PolicyRule rule;
    rule.families = families.value();
    if (r.contains("first_layer")) {
      // Checked before the conversion: 2^31 and above wrapped silently (issue #32).
      if (!r["first_layer"].is_number_integer() || !fits_layer(r["first_layer"])) {
        return bad("first_layer must be an integer from -1 to " + std::to_string(kMaxLayerIndex));
      }
      rule.first_layer = r["first_layer"].get<int>();
    }
    if (r.contains("last_layer")) {
      // Checked before the conversion: 2^31 and above wrapped silently (issue #32).
      if (!r["last_layer"].is_number_integer() || !fits_layer(r["last_layer"])) {
        return bad("last_layer must be an integer from -1 to " + std::to_string(kMaxLayerIndex));
      }
      rule.last_layer = r["last_layer"].get<int>();
    }
    if (r.contains("strategy") && !r["strategy"].is_string()) {
      return bad("strategy must be a string (batched, row_wise or batch_invariant)");
    }
    const std::string strategy = r.value("strategy", std::string("row_wise"));
    if (strategy == "row_wise") {
      rule.strategy = Strategy::RowWise;
    } else if (strategy == "batched") {
      rule.strategy = Strategy::Batched;
    } else if (strategy == "batch_invariant") {
      rule.strategy = Strategy::BatchInvariant;
    } else {
      return bad("unknown strategy '" + strategy.substr(0, 60) +
                 "' (known: batched, row_wise, batch_invariant)");
    }
    p.rules.push_back(rule);
  }
  if (doc.contains("emulate_split_k")) {
    if (!doc["emulate_split_k"].is_array()) {
      return bad("emulate_split_k must be an array of family names");
    }
    auto families = families_from_json(doc["emulate_split_k"]);
    if (!families.ok()) {
      return families.error();
    }
    p.emulate_split_k = families.value();
  }
  return p;
}

}  // namespace

base::Result<OpPolicy> policy_from_json(const nlohmann::json& doc) {
  try {
    return policy_from_json_or_throw(doc);
  } catch (const nlohmann::json::exception&) {
    // A field of the wrong type that the checks missed: still a bad policy, not a crash.
    return base::Error{base::ErrorCode::InvalidArgument, "op policy: a field has the wrong type"};
  }
}

namespace {

// One part of a policy text (no '+' outside inline JSON): a name, a family list or JSON.
base::Result<OpPolicy> policy_part_from_text(const std::string& text) {
  if (!text.empty() && text.front() == '{') {
    // Inline policy JSON (the GUI's per-family, per-layer-range workaround editor).
    auto doc = base::parse_json(text, "inline policy");
    if (!doc.ok()) {
      return doc.error();
    }
    return policy_from_json(doc.value());
  }
  if (const auto colon = text.find(':'); colon != std::string::npos) {
    // A family list: "row_wise:selfcond_matmul,router_proj", "batch_invariant:selfcond_matmul".
    const std::string strategy = text.substr(0, colon);
    if (strategy == "row_wise" || strategy == "batch_invariant") {
      FamilySet families;
      std::size_t start = colon + 1;
      while (start <= text.size()) {
        const std::size_t comma = std::min(text.find(',', start), text.size());
        const std::string name = text.substr(start, comma - start);
        const auto family = family_from_name(name);
        if (!family) {
          return base::Error{base::ErrorCode::InvalidArgument, "policy '" + text.substr(0, 100) +
                                                                   "': unknown op family '" +
                                                                   name.substr(0, 40) + "'"};
        }
        families.set(static_cast<std::size_t>(*family));
        start = comma + 1;
      }
      return strategy == "row_wise" ? OpPolicy::row_wise(families, text)
                                    : OpPolicy::batch_invariant(families, text);
    }
  }
  for (OpPolicy (*make)() : {&OpPolicy::default_policy, &OpPolicy::issue_workaround,
                             &OpPolicy::row_wise_all, &OpPolicy::batch_invariant_all}) {
    if (OpPolicy p = make(); p.name == text) {
      return p;
    }
  }
  if (find_emulation_profile(text) != nullptr) {
    return OpPolicy::emulation_profile(text);
  }
  const std::string shown = text.size() > 100 ? text.substr(0, 97) + "..." : text;
  return base::Error{base::ErrorCode::InvalidArgument,
                     "policy '" + shown +
                         "': expected default, issue_workaround, row_wise_all, batch_invariant, "
                         "row_wise:FAMILY,... or batch_invariant:FAMILY,..., emulated_h200, "
                         "emulated_h100_report, emulated_split_k, policy JSON, such parts "
                         "joined with + or a JSON file"};
}

}  // namespace

base::Result<OpPolicy> policy_from_text(const std::string& text) {
  // Texts come from other people's experiment files: bounded, and split without recursion (a
  // chain of 20,000 parts joined with + overflowed the stack, issue #32).
  if (text.size() > kMaxPolicyTextBytes) {
    return base::Error{base::ErrorCode::InvalidArgument,
                       "policy text of " + std::to_string(text.size()) + " bytes (at most " +
                           std::to_string(kMaxPolicyTextBytes) + ")"};
  }
  // Parts joined with +, left to right; inline JSON runs to the end (it may hold a '+').
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t plus = text.find('+', start);
    if ((start < text.size() && text[start] == '{') || plus == std::string::npos) {
      parts.push_back(text.substr(start));
      break;
    }
    parts.push_back(text.substr(start, plus - start));
    start = plus + 1;
    if (parts.size() >= kMaxPolicyParts) {
      return base::Error{base::ErrorCode::InvalidArgument,
                         "policy '" + text.substr(0, 60) + "...': more than " +
                             std::to_string(kMaxPolicyParts) + " parts joined with +"};
    }
  }
  std::vector<OpPolicy> parsed;
  parsed.reserve(parts.size());
  for (const std::string& part : parts) {
    auto p = policy_part_from_text(part);
    if (!p.ok()) {
      return p;
    }
    parsed.push_back(std::move(p.value()));
  }
  // Folded from the right, as "a+(b+c)": names and rules exactly as before.
  OpPolicy out = std::move(parsed.back());
  for (std::size_t i = parsed.size() - 1; i-- > 0;) {
    out = combine(parsed[i], out);
  }
  return out;
}

std::string policy_text(const OpPolicy& policy) {
  if (auto named = policy_from_text(policy.name); named.ok() && named.value() == policy) {
    return policy.name;
  }
  return base::dump_json_lossy(to_json(policy));
}

base::Result<OpPolicy> policy_from_argument(const std::string& text_or_file) {
  auto policy = policy_from_text(text_or_file);
  if (policy.ok() || (!text_or_file.empty() && text_or_file.front() == '{')) {
    return policy;
  }
  // A policy file: a FIFO, device or directory is refused without blocking on it.
  if (auto checked = base::check_input_file(text_or_file, "policy file"); !checked.ok()) {
    return checked.error().code == base::ErrorCode::FileNotFound ? policy.error() : checked.error();
  }
  auto text = base::read_input_file(text_or_file, "policy file", std::uint64_t{16} << 20);
  if (!text.ok()) {
    return text.error();
  }
  auto doc = base::parse_json(text.value(), "policy file '" + text_or_file + "'");
  if (!doc.ok()) {
    return doc.error();
  }
  return policy_from_json(doc.value());
}

std::string describe(const OpPolicy& policy) {
  std::string emulation;
  if (policy.emulate_split_k.any()) {
    std::string on = "every GEMM";
    if (policy.emulate_split_k != gemm_families()) {
      on.clear();
      for (const auto& f : family_names(policy.emulate_split_k)) {
        on += (on.empty() ? "{" : ", ") + f;
      }
      on += "}";
    }
    emulation = "; EMULATED split-K (CPU emulation) on " + on;
  }
  if (policy.rules.empty()) {
    return policy.name + ": every op batched" + emulation;
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
  return out + emulation;
}

}  // namespace batchlens::ops
