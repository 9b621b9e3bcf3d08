// SPDX-License-Identifier: Apache-2.0
#include "core/experiment/experiment.h"

#include <algorithm>
#include <iomanip>
#include <limits>
#include <sstream>
#include <type_traits>

#include "core/base/input.h"
#include "core/base/named.h"
#include "core/experiment/culprit.h"
#include "core/experiment/schema.h"
#include "core/experiment/story.h"
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
    }
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
    }
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

namespace {

// Adds the fields that a schema declaration marks Opt::summary to a JSON object, under their
// summary keys. Only single values and lists of ints are summarised.
class SummaryFields {
 public:
  explicit SummaryFields(nlohmann::json& out) : out_(out) {}

  template <class T>
  void attr(const char* name, const T& value, const schema::Opt& o = {}) {
    add(name, value, o);
  }
  template <class T>
  void array(const char* name, const T& value, const schema::Shape& /*shape*/,
             const schema::Opt& o = {}) {
    add(name, value, o);
  }
  template <class S>
  void nested(const char* prefix, const S& s, const schema::Opt& o) {
    if (o.summarised) {
      nlohmann::json sub = nlohmann::json::object();
      schema::visit_fields(s, SummaryFields(sub));
      out_[key(prefix, o)] = std::move(sub);
    }
  }

 private:
  static const char* key(const char* name, const schema::Opt& o) {
    return *o.summary_key != '\0' ? o.summary_key : name;
  }
  template <class T>
  void add(const char* name, const T& value, const schema::Opt& o) {
    if constexpr (std::is_arithmetic_v<T> || std::is_same_v<T, std::string> ||
                  std::is_same_v<T, std::vector<int>>) {
      if (o.summarised && o.stored) {
        out_[key(name, o)] = value;
      }
    }
  }

  nlohmann::json& out_;
};

}  // namespace

nlohmann::json summary_json(const ExperimentResult& r) {
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& run : r.runs) {
    nlohmann::json j = nlohmann::json::object();
    j["id"] = run.id;
    schema::visit_fields(run, SummaryFields(j));
    runs.push_back(std::move(j));
  }
  nlohmann::json comps = nlohmann::json::array();
  for (const auto& c : r.comparisons) {
    nlohmann::json j = nlohmann::json::object();
    j["id"] = c.id;
    schema::visit_fields(c, SummaryFields(j));
    if (!c.first.found()) {
      j["first_divergence"] = nullptr;
    }
    if (const auto lines = first_divergence_kernels(r, c); !lines.empty()) {
      j["first_divergence_kernels"] = lines;
    }
    const auto [positions, scores, readable] = last_step_logit_diff(r, c);
    j["last_step_positions_differing"] = readable ? nlohmann::json(positions) : nlohmann::json();
    j["last_step_logits_differing"] = readable ? nlohmann::json(scores) : nlohmann::json();
    comps.push_back(std::move(j));
  }
  const ComparisonResult* floor = r.comparison("ref__repeat1");
  nlohmann::json out = nlohmann::json::object();
  out["model"] = r.spec.model.describe();
  schema::visit_fields(r.provenance, SummaryFields(out));  // device, device_name, libtorch, ...
  if (!r.provenance.cpu.aten_capability.empty() || !r.provenance.cpu.flags.empty()) {
    schema::visit_fields(r.provenance.cpu, SummaryFields(out));  // schema 1.3: cpu_flags, ...
  }
  out["mode"] = name(r.spec.mode);
  out["rng"] = generation::name(r.spec.rng);
  out["prefill"] = generation::name(r.spec.prefill);
  if (const std::string switches = r.spec.load.switches.describe(); !switches.empty()) {
    out["switches"] = switches;
  }
  if (const std::string id = headline_comparison(r); !id.empty()) {
    const Story story = build_story(r, id);
    out["headline"] = {{"comparison", id}, {"text", story.headline()}, {"why", story.why}};
  }
  if (r.culprit) {
    nlohmann::json c = to_json(*r.culprit);
    c["headline"] =
        r.culprit->headline(std::vector<int>(r.spec.batch_sizes.begin(), r.spec.batch_sizes.end()));
    out["culprit"] = std::move(c);
  }
  out["noise_floor_clean"] =
      floor == nullptr ? nlohmann::json(nullptr) : nlohmann::json(!floor->first.found());
  out["runs"] = std::move(runs);
  out["comparisons"] = std::move(comps);
  return out;
}

std::string summary_text(const ExperimentResult& r) {
  std::ostringstream o;
  o << "BatchLens experiment: " << r.spec.model.describe() << " on " << r.provenance.device << " ("
    << r.provenance.device_name << "), LibTorch " << r.provenance.libtorch << ", "
    << r.provenance.dtype << "\n";
  if (!r.provenance.cpu.aten_capability.empty() || !r.provenance.cpu.flags.empty()) {
    o << "CPU ISA: " << base::describe(r.provenance.cpu) << "\n";
  }
  if (r.provenance.emulated) {
    o << "NOTE: EMULATED split-K kernels (a CPU emulation of GPU batch-shape divergence)\n";
  } else if (r.provenance.device == "cpu" && r.provenance.dtype == "fp32") {
    // Whether this CPU's fp32 kernels depend on the row count varies with the CPU and the BLAS;
    // the comparisons below are the measurement.
    o << "NOTE: real CPU kernels in fp32 (not emulated): any divergence below comes from this "
         "CPU's own fp32 kernels\n";
  }
  o << "mode " << name(r.spec.mode) << ", rng " << generation::name(r.spec.rng) << ", prefill "
    << generation::name(r.spec.prefill) << ", seed " << r.spec.seed << ", " << r.layers
    << " layers, taps " << r.taps.size() << "\n";
  if (const std::string switches = r.spec.load.switches.describe(); !switches.empty()) {
    o << "switches: " << switches << "\n";
  }
  if (const std::string id = headline_comparison(r); !id.empty()) {
    const Story story = build_story(r, id);
    o << "\nheadline (" << id << "): " << story.headline() << "\n";
    if (!story.why.empty()) {
      o << "why: " << story.why << "\n";
    }
  }
  if (r.culprit) {
    const CulpritReport& c = *r.culprit;
    std::vector<int> sizes(r.spec.batch_sizes.begin(), r.spec.batch_sizes.end());
    o << "\n" << c.headline(sizes) << "\n";
    o << "culprit finder (" << ops::strategy_name(c.strategy) << "): " << c.trials.size()
      << " trials in " << std::fixed << std::setprecision(1) << c.wall_s << " s; " << c.verdict
      << "\n";
    for (std::size_t i = 0; i < c.trials.size(); ++i) {
      const CulpritTrial& t = c.trials[i];
      o << "  " << std::setw(2) << i + 1 << " " << std::left << std::setw(9) << t.stage
        << std::right << " " << (t.identical ? "identical" : "diverges ");
      if (!t.identical && t.first.found()) {
        o << " (" << t.comparison << ": canvas " << t.first.canvas + 1 << " step " << t.first.step
          << " " << t.first.tap
          << (t.first.layer >= 0 ? " layer " + std::to_string(t.first.layer) : std::string())
          << ")";
      }
      o << std::setprecision(2) << "  " << t.wall_s << " s  fix: " << t.fix << "\n";
    }
    for (const CulpritCost& k : c.costs) {
      o << std::setprecision(2) << "  cost at B=" << k.batch_size << ": decoder forward "
        << k.default_ms << " ms -> " << k.fixed_ms << " ms (" << std::showpos
        << std::setprecision(1) << 100.0 * k.overhead() << std::noshowpos << " %)\n";
    }
  }
  o << "\n";
  o << "runs:\n";
  for (const auto& run : r.runs) {
    o << "  " << std::left << std::setw(10) << run.id << " B=" << run.batch_size << "  "
      << run.policy_text << "  stop " << run.stop_position << ", steps";
    for (int s : run.steps) {
      o << " " << s;
    }
    o << std::fixed << std::setprecision(2) << "  (" << run.wall_time_s << " s)\n";
  }
  o << "\ncomparisons (row 0 unless noted):\n";
  for (const auto& c : r.comparisons) {
    o << "  " << c.id << (c.kind == "rows" ? " (rows 1.. vs row 0)" : "") << ":\n";
    o << "    first divergence: " << describe(c.first) << "\n";
    for (const std::string& line : first_divergence_kernels(r, c)) {
      o << "      kernels: " << line << "\n";
    }
    if (c.kind == "row0") {
      const auto [positions, scores, readable] = last_step_logit_diff(r, c);
      const RunResult* ref = r.run(c.reference);
      const RunResult* run = r.run(c.run);
      const std::size_t total =
          ref != nullptr && run != nullptr ? std::max(ref->tokens.size(), run->tokens.size()) : 0;
      o << "    text " << (c.tokens_identical ? "identical" : "DIFFERS") << " (" << c.tokens_changed
        << " of " << total << " tokens changed), stop "
        << (c.stop_changed ? "CHANGED" : "unchanged") << ", steps "
        << (c.steps_changed ? "CHANGED" : "unchanged") << "\n";
      if (readable) {
        o << std::setprecision(4) << "    last compared step: " << 100.0 * positions
          << "% of positions and " << 100.0 * scores << "% of token scores differ\n";
      } else {
        o << "    last compared step: unknown (the comparison's arrays do not fit their shapes)\n";
      }
    }
  }
  if (const ComparisonResult* floor = r.comparison("ref__repeat1")) {
    o << "\nnoise floor (B=1 repeat): "
      << (floor->first.found() ? "NOT CLEAN - the engine is not deterministic here"
                               : "clean (bitwise identical)")
      << "\n";
  }
  return o.str();
}

}  // namespace batchlens::experiment
