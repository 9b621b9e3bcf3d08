// SPDX-License-Identifier: Apache-2.0
#include "core/analysis/summary.h"

#include <algorithm>
#include <iomanip>
#include <sstream>
#include <type_traits>

#include "core/analysis/kernel_evidence.h"
#include "core/analysis/story.h"
#include "core/experiment/culprit_report.h"
#include "core/experiment/schema.h"

namespace batchlens::analysis {

using experiment::ComparisonResult;
using experiment::CulpritCost;
using experiment::CulpritReport;
using experiment::CulpritTrial;
using experiment::ExperimentResult;
using experiment::RunResult;
namespace schema = experiment::schema;

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
    } else if constexpr (std::is_enum_v<T>) {
      if (o.summarised && o.stored) {
        out_[key(name, o)] = experiment::name(value);
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
    if (const experiment::ExactAtDivergence* e = r.exact ? r.exact->find(c.id) : nullptr) {
      j["exact"] = experiment::exact_lines(*e);
    }
    const auto [positions, scores, readable] = last_step_logit_diff(r, c);
    j["last_step_positions_differing"] = readable ? nlohmann::json(positions) : nlohmann::json();
    j["last_step_logits_differing"] = readable ? nlohmann::json(scores) : nlohmann::json();
    comps.push_back(std::move(j));
  }
  const ComparisonResult* floor = r.comparison(experiment::noise_floor_comparison());
  nlohmann::json out = nlohmann::json::object();
  out["model"] = r.spec.model.describe();
  schema::visit_fields(r.provenance, SummaryFields(out));  // device, device_name, libtorch, ...
  if (!r.provenance.cpu.aten_capability.empty() || !r.provenance.cpu.flags.empty()) {
    schema::visit_fields(r.provenance.cpu, SummaryFields(out));  // schema 1.3: cpu_flags, ...
  }
  out["mode"] = name(r.spec.mode);
  out["rng"] = generation::name(r.spec.rng);
  out["prefill"] = generation::name(r.spec.prefill);
  if (r.spec.composition.mixed() || r.spec.composition.row != 0) {
    out["batch_rows"] = describe(r.spec.composition);
    out["companions"] = r.spec.composition.companions.size();
    out["row"] = r.spec.composition.row;
    out["positions"] = generation::name(r.spec.composition.positions);
  }
  if (const std::string switches = r.spec.load.switches.describe(); !switches.empty()) {
    out["switches"] = switches;
  }
  if (const std::string id = headline_comparison(r); !id.empty()) {
    const Story story = build_story(r, id);
    out["headline"] = {{"comparison", id}, {"text", story.headline()}, {"why", story.why}};
  }
  if (r.causes) {
    out["causes"] = to_json(*r.causes);
    out["causes"]["layout"] = r.causes->layout_text();
  }
  if (r.exact) {
    out["exact"] = to_json(*r.exact);
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
    o << "CPU ISA: " << base::describe(r.provenance.cpu);
    if (r.provenance.device == "cpu" && r.provenance.threads > 0) {
      // Chosen by measurement at load (setup/cpu_threads.h): one on a busy machine.
      o << "; " << r.provenance.threads << " LibTorch thread"
        << (r.provenance.threads > 1 ? "s" : "");
    }
    o << "\n";
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
  if (r.spec.composition.mixed() || r.spec.composition.row != 0) {
    o << "batch rows: " << describe(r.spec.composition) << "\n";
  }
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
  if (r.causes) {
    const experiment::CauseReport& c = *r.causes;
    o << "row under test: " << c.layout_text() << "\n";
    if (!c.verdict.empty()) {
      o << "causes: " << c.verdict << "\n";
    }
    for (const experiment::CauseTrial& t : c.trials) {
      o << "  re-run " << t.name << " (" << t.positions << " positions): "
        << (t.diverges ? "still differs (" + t.first + ")" : std::string("B=1's bit for bit"))
        << "\n";
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
      o << "  cost at B=" << k.batch_size << ": " << k.detail() << "\n";
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
  o << "\ncomparisons (row " << r.spec.composition.row << " unless noted):\n";
  for (const auto& c : r.comparisons) {
    o << "  " << c.id << (c.kind == experiment::ComparisonKind::Rows ? " (rows 1.. vs row 0)" : "")
      << ":\n";
    o << "    first divergence: " << describe(c.first) << "\n";
    for (const std::string& line : first_divergence_kernels(r, c)) {
      o << "      kernels: " << line << "\n";
    }
    if (const experiment::ExactAtDivergence* e = r.exact ? r.exact->find(c.id) : nullptr) {
      for (const std::string& line : experiment::exact_lines(*e)) {
        o << "      exact (fp64): " << line << "\n";
      }
    }
    if (c.kind == experiment::ComparisonKind::Row0) {
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
  if (const ComparisonResult* floor = r.comparison(experiment::noise_floor_comparison())) {
    o << "\nnoise floor (B=1 repeat): "
      << (floor->first.found() ? "NOT CLEAN - the engine is not deterministic here"
                               : "clean (bitwise identical)")
      << "\n";
  }
  return o.str();
}

}  // namespace batchlens::analysis
