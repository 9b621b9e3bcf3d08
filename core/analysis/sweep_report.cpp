// SPDX-License-Identifier: Apache-2.0
#include "core/analysis/sweep_report.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/analysis/sweep_merge.h"
#include "core/analysis/sweep_stats.h"
#include "core/experiment/provenance.h"

namespace batchlens::analysis {

using experiment::ExperimentSpec;
using experiment::Provenance;

namespace {

using nlohmann::json;

}  // namespace

std::string sweep_text(const SweepRecords& s) {
  std::ostringstream o;
  const ExperimentSpec& b = s.spec.base;
  o << "sweep " << s.id << ": " << b.model.describe() << " on " << b.load.device << " ("
    << b.load.dtype << "), " << s.spec.prompts.size() << " prompt(s) x " << s.spec.seeds.size()
    << " seed(s), " << name(b.mode) << " mode, policy " << ops::policy_text(b.policy)
    << (b.workaround ? ", workaround " + ops::policy_text(*b.workaround) : std::string()) << "\n"
    << "items finished: " << s.items_done << " of " << s.items_total << "\n";
  if (s.spec.mixed()) {  // issue #35's axes
    o << "batch rows: " << s.spec.companion_sets.size() << " set(s) of companions (";
    for (std::size_t c = 0; c < s.spec.companion_sets.size(); ++c) {
      o << (c > 0 ? ", " : "") << companions_label(s.spec, static_cast<int>(c));
    }
    o << ") x row(s) under test";
    for (const std::int64_t row : s.spec.rows) {
      o << " " << row;
    }
    o << ", positions " << generation::name(b.composition.positions) << "\n";
  }
  // Where the rows were computed: a mixed cluster shows as several lines.
  std::vector<int> rows_of(s.provenances.size(), 0);
  for (const SweepRow& r : s.rows) {
    if (r.provenance >= 0 && r.provenance < static_cast<int>(rows_of.size())) {
      ++rows_of[static_cast<std::size_t>(r.provenance)];
    }
  }
  for (std::size_t i = 0; i < s.provenances.size(); ++i) {
    const Provenance& p = s.provenances[i];
    o << "computed on " << p.host << ": " << p.device_name << " (" << p.device
      << (p.driver.empty() ? std::string() : ", driver " + p.driver)
      << (p.cuda.empty() ? std::string() : ", CUDA " + p.cuda) << ", LibTorch " << p.libtorch
      << ", BatchLens " << p.tool_version << "): " << rows_of[i] << " row(s)\n";
  }
  // An unsharded sweep is one "shard" of one: nothing to say (issue #34 saw "shards: 0/1").
  const bool sharded = std::any_of(s.shards.begin(), s.shards.end(),
                                   [](const SweepShard& sh) { return sh.count > 1; });
  if (sharded) {
    o << "shards:";
    for (const SweepShard& sh : s.shards) {
      o << " " << sh.index + 1 << " of " << sh.count << " (" << sh.items << " items, "
        << s.provenances.at(static_cast<std::size_t>(sh.provenance)).host << ")";
    }
    o << "\n";
  }
  if (const std::vector<int> missing = missing_items(s); !missing.empty()) {
    o << "items not finished:";
    for (std::size_t i = 0; i < missing.size() && i < 20; ++i) {
      o << " " << missing[i];
    }
    o << (missing.size() > 20 ? " ..." : "") << "\n";
  }
  o << std::fixed;
  for (const SweepStats& st : sweep_stats(s.spec, s.rows)) {
    o << "\n" << (st.group == experiment::RunGroup::Main ? "B=" : "workaround B=") << st.batch_size;
    if (s.spec.mixed()) {
      o << ", " << companions_label(s.spec, st.companions) << ", row " << st.row;
    }
    o << ": text changed " << st.text_changed << "/" << st.n << " (" << std::setprecision(1)
      << 100.0 * st.text_changed / std::max(1, st.n) << " %, 95 % CI " << 100.0 * st.changed_ci.lo
      << "-" << 100.0 * st.changed_ci.hi << " %)\n"
      << "  tokens changed: median " << st.tokens_changed_median << ", max "
      << st.tokens_changed_max << "; stop changed " << st.stop_changed << "/" << st.n
      << "; steps changed " << st.steps_changed << "/" << st.n << "\n"
      << "  first divergence found in " << st.diverged << "/" << st.n;
    if (!st.first_steps.empty()) {
      o << "; at";
      for (const auto& [at, count] : st.first_steps) {
        o << " c" << at.first + 1 << "s" << at.second << ":" << count;
      }
    }
    o << "\n";
    if (!st.first_families.empty()) {
      o << "  first divergent op families:";
      for (const auto& [families, count] : st.first_families) {
        o << " " << families << " " << count;
      }
      o << "\n";
    }
  }
  return o.str();
}

json sweep_json(const SweepRecords& s) {
  json stats = json::array();
  for (const SweepStats& st : sweep_stats(s.spec, s.rows)) {
    json steps = json::array();
    for (const auto& [at, count] : st.first_steps) {
      steps.push_back({{"canvas", at.first}, {"step", at.second}, {"items", count}});
    }
    stats.push_back({{"group", experiment::name(st.group)},
                     {"batch_size", st.batch_size},
                     {"n", st.n},
                     {"text_changed", st.text_changed},
                     {"ci95", {st.changed_ci.lo, st.changed_ci.hi}},
                     {"tokens_changed_median", st.tokens_changed_median},
                     {"tokens_changed_max", st.tokens_changed_max},
                     {"stop_changed", st.stop_changed},
                     {"steps_changed", st.steps_changed},
                     {"diverged", st.diverged},
                     {"first_steps", steps},
                     {"first_families", st.first_families}});
    if (s.spec.mixed()) {
      stats.back()["companions"] = st.companions;
      stats.back()["row"] = st.row;
    }
  }
  json rows = json::array();
  for (const SweepRow& r : s.rows) {
    json j = to_json(r);
    j["provenance"] = r.provenance;
    rows.push_back(std::move(j));
  }
  json provenances = json::array();
  for (const Provenance& p : s.provenances) {
    provenances.push_back(experiment::provenance_to_json(p));
  }
  json shards = json::array();
  for (const SweepShard& sh : s.shards) {
    shards.push_back({{"index", sh.index},
                      {"count", sh.count},
                      {"items", sh.items},
                      {"provenance", sh.provenance}});
  }
  return {{"sweep_id", s.id},
          {"items_done", s.items_done},
          {"items_total", s.items_total},
          {"spec", to_json(s.spec)},
          {"stats", stats},
          {"rows", rows},
          {"provenances", provenances},
          {"shards", shards}};
}

}  // namespace batchlens::analysis
