// SPDX-License-Identifier: Apache-2.0
#include "core/experiment/culprit_report.h"

#include <cstdio>

namespace batchlens::experiment {

std::string CulpritReport::headline(const std::vector<int>& batch_sizes) const {
  if (!found) {
    return "Culprit: none — " + verdict;
  }
  std::string sizes;
  for (const int b : batch_sizes) {
    sizes += (sizes.empty() ? "" : ",") + std::to_string(b);
  }
  ops::FamilySet families;
  std::string ranges;
  for (const ops::PolicyRule& r : fix.rules) {
    families |= r.families;
    if (r.first_layer != 0 || r.last_layer >= 0) {
      ranges += " " + ops::family_list(r.families) + " layers " + std::to_string(r.first_layer) +
                ".." + (r.last_layer < 0 ? std::string("last") : std::to_string(r.last_layer));
    }
  }
  std::string out =
      "Culprit: " + ops::family_list(families) + " " + std::string(ops::strategy_name(strategy)) +
      (ranges.empty() ? "" : " (" + ranges.substr(1) + ")") + " — with it B=" + sizes +
      (confirmed ? " are bitwise identical to B=1" : " are identical in lockstep only");
  if (!costs.empty()) {
    out += "; cost " + costs.back().text();
  }
  return out;
}

std::string CulpritCost::detail() const {
  const auto side = [](double median, double q1, double q3) {
    char buf[96];
    if (q3 > 0) {
      std::snprintf(buf, sizeof buf, "%.2f ms (IQR %.2f-%.2f)", median, q1, q3);
    } else {
      std::snprintf(buf, sizeof buf, "%.2f ms", median);
    }
    return std::string(buf);
  };
  char pct[32];
  std::snprintf(pct, sizeof pct, "%+.1f %%", 100.0 * overhead());
  return "decoder forward " + side(default_ms, default_q1_ms, default_q3_ms) + " -> " +
         side(fixed_ms, fixed_q1_ms, fixed_q3_ms) + ": " + pct +
         (noisy ? ", within the noise" : "") + (cpu ? ", on a CPU, not a GPU cost" : "");
}

std::string CulpritCost::text() const {
  char buf[96];
  if (noisy) {
    std::snprintf(buf, sizeof buf, "within the noise at B=%d (median %+.1f %%)", batch_size,
                  100.0 * overhead());
  } else {
    std::snprintf(buf, sizeof buf, "%+.1f %% at B=%d", 100.0 * overhead(), batch_size);
  }
  return std::string(buf) + (cpu ? " on a CPU, not a GPU cost" : "");
}

nlohmann::json to_json(const CulpritReport& r) {
  nlohmann::json trials = nlohmann::json::array();
  for (const CulpritTrial& t : r.trials) {
    trials.push_back({{"stage", t.stage},
                      {"fix", t.fix},
                      {"identical", t.identical},
                      {"comparison", t.comparison},
                      {"tick", t.first.tick},
                      {"canvas", t.first.canvas},
                      {"step", t.first.step},
                      {"layer", t.first.layer},
                      {"tap", t.first.tap},
                      {"wall_s", t.wall_s}});
  }
  nlohmann::json costs = nlohmann::json::array();
  for (const CulpritCost& c : r.costs) {
    costs.push_back({{"batch_size", c.batch_size},
                     {"default_ms", c.default_ms},
                     {"fixed_ms", c.fixed_ms},
                     {"default_iqr_ms", {c.default_q1_ms, c.default_q3_ms}},
                     {"fixed_iqr_ms", {c.fixed_q1_ms, c.fixed_q3_ms}},
                     {"noisy", c.noisy},
                     {"cpu", c.cpu}});
  }
  return {{"strategy", std::string(ops::strategy_name(r.strategy))},
          {"diverged", r.diverged},
          {"found", r.found},
          {"confirmed", r.confirmed},
          {"fix", ops::to_json(r.fix)},
          {"verdict", r.verdict},
          {"trials", trials},
          {"costs", costs},
          {"wall_s", r.wall_s}};
}

base::Result<CulpritReport> culprit_from_json(const nlohmann::json& doc) {
  const auto bad = [](const std::string& what) {
    return base::Error{base::ErrorCode::InvalidArgument, "culprit report: " + what};
  };
  try {
    if (!doc.is_object() || !doc.contains("trials") || !doc["trials"].is_array() ||
        !doc.contains("fix")) {
      return bad(R"(expected an object with "fix" and a "trials" array)");
    }
    CulpritReport r;
    const std::string strategy = doc.value("strategy", std::string("row_wise"));
    if (strategy == "row_wise") {
      r.strategy = ops::Strategy::RowWise;
    } else if (strategy == "batch_invariant") {
      r.strategy = ops::Strategy::BatchInvariant;
    } else {
      return bad("unknown strategy");
    }
    r.diverged = doc.value("diverged", false);
    r.found = doc.value("found", false);
    r.confirmed = doc.value("confirmed", false);
    r.verdict = doc.value("verdict", std::string());
    r.wall_s = doc.value("wall_s", 0.0);
    auto fix = ops::policy_from_json(doc["fix"]);
    if (!fix.ok()) {
      return fix.error();
    }
    r.fix = fix.value();
    if (doc["trials"].size() > 100000) {
      return bad("too many trials");
    }
    for (const auto& t : doc["trials"]) {
      if (!t.is_object()) {
        return bad("a trial is not an object");
      }
      CulpritTrial x;
      x.stage = t.value("stage", std::string());
      x.fix = t.value("fix", std::string());
      x.identical = t.value("identical", false);
      x.comparison = t.value("comparison", std::string());
      x.first.tick = t.value("tick", -1);
      x.first.canvas = t.value("canvas", -1);
      x.first.step = t.value("step", -1);
      x.first.layer = t.value("layer", -1);
      x.first.tap = t.value("tap", std::string());
      x.wall_s = t.value("wall_s", 0.0);
      r.trials.push_back(std::move(x));
    }
    if (doc.contains("costs")) {
      if (!doc["costs"].is_array() || doc["costs"].size() > 4096) {
        return bad("costs must be a short array");
      }
      for (const auto& c : doc["costs"]) {
        CulpritCost k;
        k.batch_size = c.value("batch_size", 0);
        k.default_ms = c.value("default_ms", 0.0);
        k.fixed_ms = c.value("fixed_ms", 0.0);
        // Files before issue #34 have no spread.
        const auto range = [&c](const char* key, double& q1, double& q3) {
          if (c.contains(key)) {
            const auto v = c.at(key).get<std::vector<double>>();
            if (v.size() == 2) {
              q1 = v[0];
              q3 = v[1];
            }
          }
        };
        range("default_iqr_ms", k.default_q1_ms, k.default_q3_ms);
        range("fixed_iqr_ms", k.fixed_q1_ms, k.fixed_q3_ms);
        k.noisy = c.value("noisy", false);
        k.cpu = c.value("cpu", false);
        r.costs.push_back(k);
      }
    }
    return r;
  } catch (const nlohmann::json::exception&) {
    return bad("a field has the wrong type");
  }
}

}  // namespace batchlens::experiment
