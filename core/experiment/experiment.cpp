// SPDX-License-Identifier: Apache-2.0
#include "core/experiment/experiment.h"

#include <algorithm>
#include <iomanip>
#include <limits>
#include <sstream>
#include <type_traits>

#include "core/base/input.h"
#include "core/base/named.h"
#include "core/ops/policy.h"
#include "core/probe/tap_names.h"

namespace batchlens::experiment {

namespace {

using base::ErrorCode;

base::Error bad(const std::string& m) {
  return base::Error{ErrorCode::InvalidArgument, "experiment: " + m};
}

[[noreturn]] void bad_field(const std::string& key, const char* what) {
  throw base::ErrorException(ErrorCode::FileCorrupted, "experiment spec: " + key + ": " + what);
}

// A JSON integer in T's range. nlohmann's get<integer>() converts a floating-point number with a
// static_cast: undefined behaviour when it does not fit (1e20 as "seed", found by fuzz_spec) and
// a silent truncation when it does.
template <class T>
T to_integer(const nlohmann::json& v, const std::string& key) {
  static_assert(std::is_integral_v<T>);
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) {
      bad_field(key, "out of range");
    }
    return static_cast<T>(u);
  }
  if (!v.is_number_integer()) {
    bad_field(key, "expected an integer");
  }
  // Signed storage: a negative number, or one built in memory rather than parsed from text.
  const auto i = v.get<std::int64_t>();
  if (i >= 0) {
    if (static_cast<std::uint64_t>(i) > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) {
      bad_field(key, "out of range");
    }
    return static_cast<T>(i);
  }
  if constexpr (std::is_signed_v<T>) {
    if (i < static_cast<std::int64_t>(std::numeric_limits<T>::min())) {
      bad_field(key, "out of range");
    }
  } else {
    bad_field(key, "out of range");
  }
  return static_cast<T>(i);
}

template <class T>
std::vector<T> integer_list(const nlohmann::json& j, const char* key, std::vector<T> fallback) {
  if (!j.contains(key)) {
    return fallback;
  }
  const nlohmann::json& v = j[key];
  if (!v.is_array()) {
    bad_field(key, "expected a list of integers");
  }
  std::vector<T> out;
  out.reserve(v.size());
  for (const nlohmann::json& e : v) {
    out.push_back(to_integer<T>(e, key));
  }
  return out;
}

// A mode or policy stored by name: absent gives `fallback`; another type or an unknown name is
// FileCorrupted naming the field.
template <class T, class Parse>
T parsed_field(const nlohmann::json& j, const char* key, T fallback, Parse parse) {
  if (!j.contains(key)) {
    return fallback;
  }
  if (!j[key].is_string()) {
    base::raise(ErrorCode::FileCorrupted,
                std::string("experiment spec: ") + key + " is not a string");
  }
  auto parsed = parse(j[key].template get<std::string>());
  if (!parsed.ok()) {
    base::raise(ErrorCode::FileCorrupted, "experiment spec: " + parsed.error().message);
  }
  return parsed.value();
}

// The spec's fields, named once: to_json (SpecWriter) and spec_from_json (SpecReader) visit them.
// A visitor has field(key, member) for each member type below and object(key, overrides).
template <class S, class V>
void visit_spec(S& s, V& v) {
  v.field("preset", s.model.preset);
  v.field("checkpoint", s.model.checkpoint_dir);
  v.field("weight_seed", s.model.seed);
  v.field("device", s.load.device);
  v.field("dtype", s.load.dtype);
  v.field("experts", s.load.experts);
  v.field("prompt", s.prompt);
  v.field("chat_template", s.chat_template);
  v.field("prompt_ids", s.prompt_ids);
  v.field("seed", s.seed);
  v.object("overrides", s.overrides);
  v.field("batch_sizes", s.batch_sizes);
  v.field("repeats", s.repeats);
  v.field("rng", s.rng);
  v.field("prefill", s.prefill);
  v.field("mode", s.mode);
  v.field("policy", s.policy);
  v.field("workaround", s.workaround);
  v.field("taps", s.taps);
  v.field("switches", s.load.switches);
  v.field("composition", s.composition);
  // Not `kernels`: whether kernel provenance is recorded never changes the runs (the file's
  // /kernels group says whether it was).
}

template <class O, class V>
void visit_overrides(O& o, V& v) {
  v.field("max_denoising_steps", o.max_denoising_steps);
  v.field("max_new_tokens", o.max_new_tokens);
  v.field("t_min", o.t_min);
  v.field("t_max", o.t_max);
  v.field("entropy_bound", o.entropy_bound);
  v.field("stability_threshold", o.stability_threshold);
  v.field("confidence_threshold", o.confidence_threshold);
}

// Modes by name (generation::name, experiment::name) and back.
base::Result<generation::RngMode> parse_as(generation::RngMode /*tag*/, std::string_view text) {
  return generation::parse_rng_mode(text);
}
base::Result<generation::PrefillMode> parse_as(generation::PrefillMode /*tag*/,
                                               std::string_view text) {
  return generation::parse_prefill_mode(text);
}
base::Result<generation::PositionMode> parse_as(generation::PositionMode /*tag*/,
                                                std::string_view text) {
  return generation::parse_position_mode(text);
}
base::Result<RunMode> parse_as(RunMode /*tag*/, std::string_view text);

class SpecWriter {
 public:
  explicit SpecWriter(nlohmann::json& out) : out_(out) {}
  template <class T>
  void field(const char* key, const T& value) {
    if constexpr (std::is_enum_v<T>) {
      out_[key] = name(value);
    } else {
      out_[key] = value;
    }
  }
  void field(const char* key, const std::filesystem::path& value) { out_[key] = value.string(); }
  void field(const char* key, const ops::OpPolicy& value) { out_[key] = ops::policy_text(value); }
  void field(const char* key, const std::optional<ops::OpPolicy>& value) {
    out_[key] = value ? ops::policy_text(*value) : std::string();
  }
  template <class T>
  void field(const char* key, const std::optional<T>& value) {
    if (value) {
      out_[key] = *value;
    }
  }
  // Only when set: files of runs with every fused kernel and CUDA graphs allowed stay as they
  // were, and older readers ignore the key.
  void field(const char* key, const base::Switches& value) {
    if (!value.describe().empty()) {
      out_[key] = {{"fused", value.fused},
                   {"fused_off", value.fused_off},
                   {"cuda_graphs", value.cuda_graphs}};
      if (value.bi_plan != base::BiPlan::Classes) {  // the plan changes that mode's bits
        out_[key]["bi_plan"] = base::bi_plan_name(value.bi_plan);
      }
    }
  }
  // Only for a mixed batch or another row: identical-row files stay as they were.
  void field(const char* key, const Composition& value) {
    if (!value.mixed() && value.row == 0) {
      return;
    }
    nlohmann::json companions = nlohmann::json::array();
    for (const setup::Prompt& p : value.companions) {
      companions.push_back(setup::to_json(p));
    }
    out_[key] = {{"companions", std::move(companions)},
                 {"row", value.row},
                 {"positions", generation::name(value.positions)}};
  }
  void object(const char* key, const generation::GenerationOverrides& value) {
    nlohmann::json sub = nlohmann::json::object();
    SpecWriter w(sub);
    visit_overrides(value, w);
    out_[key] = std::move(sub);
  }

 private:
  nlohmann::json& out_;
};

// Absent keys keep the member's value (a default spec's); a value of another type or out of
// range is FileCorrupted naming the field (nlohmann's type errors are turned into that by
// spec_from_json).
class SpecReader {
 public:
  SpecReader(const nlohmann::json& in, std::string prefix) : in_(in), prefix_(std::move(prefix)) {}
  template <class T>
  void field(const char* key, T& value) {
    if (!in_.contains(key)) {
      return;
    }
    if constexpr (std::is_enum_v<T>) {
      value = parsed_field(in_, key, value, [](std::string_view t) { return parse_as(T{}, t); });
    } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      value = to_integer<T>(in_[key], prefix_ + key);
    } else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) {
      value = integer_list(in_, key, value);
    } else {
      value = in_[key].template get<T>();
    }
  }
  void field(const char* key, std::filesystem::path& value) {
    value = in_.value(key, std::string());
  }
  void field(const char* key, ops::OpPolicy& value) {
    value = parsed_field(in_, key, value, ops::policy_from_text);
  }
  // "" (the key as every file writes it without a workaround) or a policy.
  void field(const char* key, std::optional<ops::OpPolicy>& value) {
    if (!in_.value(key, std::string()).empty()) {
      value = parsed_field(in_, key, ops::OpPolicy{}, ops::policy_from_text);
    }
  }
  template <class T>
  void field(const char* key, std::optional<T>& value) {
    if (!in_.contains(key) || in_[key].is_null()) {
      return;
    }
    if constexpr (std::is_integral_v<T>) {
      value = to_integer<T>(in_[key], prefix_ + key);
    } else {
      value = in_[key].template get<T>();
    }
  }
  void field(const char* key, base::Switches& value) {
    if (in_.contains(key)) {
      const auto& w = in_.at(key);
      value.fused = w.at("fused").get<bool>();
      value.fused_off = w.at("fused_off").get<std::vector<std::string>>();
      value.cuda_graphs = w.at("cuda_graphs").get<bool>();
      value.bi_plan = base::BiPlan::Classes;
      if (w.contains("bi_plan")) {
        auto plan = base::parse_bi_plan(w.at("bi_plan").get<std::string>());
        if (!plan.ok()) {
          base::raise(base::ErrorCode::InvalidArgument,
                      "switches.bi_plan: " + plan.error().message);
        }
        value.bi_plan = plan.value();
      }
    }
  }
  void field(const char* key, Composition& value) {
    if (!in_.contains(key)) {
      return;
    }
    const nlohmann::json& c = in_.at(key);
    const std::string where = prefix_ + key;
    if (!c.is_object() || !c.contains("companions") || !c.at("companions").is_array() ||
        c.at("companions").size() > setup::kMaxPrompts) {
      base::corrupt(where + ": needs 'companions', an array of at most " +
                    std::to_string(setup::kMaxPrompts) + " prompts");
    }
    int i = 0;
    for (const nlohmann::json& p : c.at("companions")) {
      value.companions.push_back(
          base::take(setup::prompt_from_json(p, where + " companion " + std::to_string(++i))));
    }
    SpecReader r(c, where + ".");
    r.field("row", value.row);
    r.field("positions", value.positions);
  }
  void object(const char* key, generation::GenerationOverrides& value) {
    if (in_.contains(key)) {
      SpecReader r(in_[key], prefix_ + key + ".");
      visit_overrides(value, r);
    }
  }

 private:
  const nlohmann::json& in_;
  std::string prefix_;
};

}  // namespace

const char* name(RunMode mode) {
  return mode == RunMode::Free ? "free" : "lockstep";
}

base::Result<RunMode> parse_run_mode(std::string_view text) {
  return base::parse_named(text, {RunMode::Free, RunMode::Lockstep}, &name, "mode");
}

namespace {
base::Result<RunMode> parse_as(RunMode /*tag*/, std::string_view text) {
  return parse_run_mode(text);
}
}  // namespace

std::string describe(const Composition& c) {
  if (!c.mixed()) {
    return c.row == 0 ? "identical rows"
                      : "identical rows, row " + std::to_string(c.row) + " under test";
  }
  const std::size_t n = c.companions.size();
  return "the prompt in row " + std::to_string(c.row) + " beside " + std::to_string(n) +
         (n == 1 ? " companion" : " companions") + " (cycled), " + generation::name(c.positions) +
         " positions";
}

namespace {

// The composition's part of validate().
base::Result<void> validate_composition(const ExperimentSpec& s) {
  const Composition& c = s.composition;
  std::int64_t smallest = 0;
  for (const std::int64_t b : s.batch_sizes) {
    smallest = smallest == 0 ? b : std::min(smallest, b);
  }
  if (c.row < 0 || (smallest > 0 && c.row >= smallest)) {
    return bad("the row under test must be in 0.." +
               std::to_string(std::max<std::int64_t>(smallest - 1, 0)) +
               " (the smallest batch has " + std::to_string(smallest) + " rows), not " +
               std::to_string(c.row));
  }
  if (c.companions.size() > setup::kMaxPrompts) {
    return bad("at most " + std::to_string(setup::kMaxPrompts) + " companions");
  }
  for (std::size_t i = 0; i < c.companions.size(); ++i) {
    const setup::Prompt& p = c.companions[i];
    const std::string what = "companion " + std::to_string(i + 1);
    if (p.ids.empty() && p.text.empty()) {
      return bad(what + " is empty");
    }
    if (auto utf8 = base::check_utf8(p.text, what); !utf8.ok()) {
      return utf8.error();
    }
  }
  if (c.mixed() && s.prefill == generation::PrefillMode::Copied) {
    return bad(
        "a batch of different prompts is prefilled as one batch (as a server does): "
        "prefill 'batched', not 'copied'");
  }
  if (!c.mixed() && c.positions == generation::PositionMode::PerRow) {
    return bad(
        "per_row positions differ from shared ones only beside other prompts: give "
        "companions");
  }
  return base::ok_result();
}

}  // namespace

base::Result<void> validate(const ExperimentSpec& s) {
  if (s.model.preset.empty() == s.model.checkpoint_dir.empty()) {
    return bad("give exactly one of a preset and a checkpoint directory");
  }
  // The spec is stored as JSON text in experiment files: its strings must be UTF-8, refused up
  // front (before a run whose file could not be written) with the byte offset.
  const std::string checkpoint = s.model.checkpoint_dir.string();
  const std::string policy = ops::policy_text(s.policy);
  const std::string workaround = s.workaround ? ops::policy_text(*s.workaround) : std::string();
  for (const auto& [text, what] :
       {std::pair{&s.prompt, "the prompt"}, std::pair{&policy, "the policy"},
        std::pair{&workaround, "the workaround"}, std::pair{&checkpoint, "the checkpoint path"}}) {
    if (auto utf8 = base::check_utf8(*text, what); !utf8.ok()) {
      return utf8.error();
    }
  }
  if (s.batch_sizes.empty() && s.repeats < 1) {
    return bad("nothing to compare: no batch sizes and no repeats");
  }
  for (std::int64_t b : s.batch_sizes) {
    if (b < 2 || b > 1024) {
      return bad("batch sizes must be in 2..1024, not " + std::to_string(b));
    }
  }
  if (s.repeats < 0 || s.repeats > 16) {
    return bad("repeats must be in 0..16");
  }
  if (s.prompt_ids.empty() && s.prompt.empty()) {
    return bad("the prompt is empty");
  }
  if (auto c = validate_composition(s); !c.ok()) {
    return c;
  }
  const bool none = s.taps.size() == 1 && s.taps[0] == "none";
  for (const auto& name : s.taps) {
    if (!none && !probe::tap_from_name(name)) {
      return bad("unknown tap '" + name + "'");
    }
  }
  const bool emulates =
      s.policy.emulate_split_k.any() || (s.workaround && s.workaround->emulate_split_k.any());
  if (emulates && s.load.device != "cpu") {
    return bad("the emulated split-K kernel is a CPU emulation; device is " + s.load.device);
  }
  if (auto g = generation::apply(s.overrides, generation::GenerationConfig{}); !g.ok()) {
    return g.error();
  }
  return base::ok_result();
}

nlohmann::json to_json(const ExperimentSpec& s) {
  nlohmann::json out = nlohmann::json::object();
  SpecWriter w(out);
  visit_spec(s, w);
  return out;
}

base::Result<ExperimentSpec> spec_from_json(const nlohmann::json& doc) {
  const nlohmann::json& j = doc;
  if (!j.is_object()) {
    return base::Error{ErrorCode::FileCorrupted, "experiment spec: not a JSON object"};
  }
  try {
    ExperimentSpec s;
    SpecReader r(j, "");
    visit_spec(s, r);
    return s;
  } catch (const nlohmann::json::exception& e) {
    return base::Error{ErrorCode::FileCorrupted, std::string("experiment spec: ") + e.what()};
  } catch (const base::ErrorException& e) {
    return e.error();
  }
}

base::Result<ExperimentSpec> spec_from_json_text(std::string_view text) {
  auto doc = base::parse_json(text, "experiment spec", ErrorCode::FileCorrupted);
  if (!doc.ok()) {
    return doc.error();
  }
  return spec_from_json(doc.value());
}

const RunResult* ExperimentResult::run(const std::string& id) const {
  for (const auto& r : runs) {
    if (r.id == id) {
      return &r;
    }
  }
  return nullptr;
}

const ComparisonResult* ExperimentResult::comparison(const std::string& id) const {
  for (const auto& c : comparisons) {
    if (c.id == id) {
      return &c;
    }
  }
  return nullptr;
}

std::string describe(const Divergence& d) {
  if (!d.found()) {
    return "none (bitwise identical at every compared step)";
  }
  std::ostringstream o;
  o << "canvas " << static_cast<std::int64_t>(d.canvas) + 1 << " · step " << d.step << ", "
    << (d.layer >= 0 ? "layer " + std::to_string(d.layer) + " " : std::string()) << d.tap
    << ", position " << d.position;
  return o.str();
}

LastStepDiff last_step_logit_diff(const ExperimentResult& r, const ComparisonResult& c) {
  const auto& f = c.frac_differ;       // [ticks, layers + 1, taps]
  const auto& pf = c.pos_frac_differ;  // [ticks, layers + 1, taps, canvas]
  if (f.empty() || pf.empty()) {
    return {};
  }
  int tap = -1;
  for (std::size_t t = 0; t < r.taps.size(); ++t) {
    tap = r.taps[t] == "logits" ? static_cast<int>(t) : tap;
  }
  if (tap < 0) {
    return {};
  }
  const LastStepDiff unreadable{0.0, 0.0, false};
  if (f.shape.size() != 3 || pf.shape.size() != 4 || pf.shape[0] != f.shape[0] ||
      r.canvas_length < 0 || static_cast<std::uint64_t>(f.shape[0]) > c.compared.size()) {
    return unreadable;
  }
  for (std::int64_t s = f.shape[0]; s-- > 0;) {
    if (c.compared[static_cast<std::size_t>(s)] == 0) {
      continue;
    }
    const float* scores = f.find({s, r.layers, tap});
    if (scores == nullptr) {
      return unreadable;
    }
    double positions = 0;
    for (std::int64_t p = 0; p < r.canvas_length; ++p) {
      const float* v = pf.find({s, r.layers, tap, p});
      if (v == nullptr) {
        return unreadable;
      }
      positions += *v > 0 ? 1 : 0;
    }
    return {r.canvas_length > 0 ? positions / static_cast<double>(r.canvas_length) : 0.0, *scores};
  }
  return {};
}

}  // namespace batchlens::experiment
