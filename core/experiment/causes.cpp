// SPDX-License-Identifier: Apache-2.0
#include "core/experiment/causes.h"

#include "core/base/json_field.h"

namespace batchlens::experiment {

namespace {

using nlohmann::json;

constexpr std::size_t kMaxEntries = 10000;

// An array field of at most kMaxEntries objects.
const json& object_list(const json& doc, const char* key, const std::string& where) {
  if (!doc.contains(key) || !doc.at(key).is_array() || doc.at(key).size() > kMaxEntries) {
    base::corrupt(where + ": '" + key + "' is not a list of at most " +
                  std::to_string(kMaxEntries) + " entries");
  }
  for (const json& x : doc.at(key)) {
    if (!x.is_object() && !x.is_string()) {
      base::corrupt(where + ": an entry of '" + key + "' is malformed");
    }
  }
  return doc.at(key);
}

}  // namespace

std::string CauseReport::layout_text() const {
  std::string out;
  for (const RowLayout& r : rows) {
    if (r.run.rfind("wa.", 0) == 0) {
      continue;  // the workaround group's batches are the same layouts again
    }
    out += (out.empty() ? "" : "; ") + std::string("B=") + std::to_string(r.batch_size) + ": ";
    if (r.pad_slots == 0) {
      out += "no padding (its prompt is the longest), positions as alone";
      continue;
    }
    out += std::to_string(r.pad_slots) + " padding slots masked";
    out += r.position_shift == 0 ? ", positions as alone"
                                 : ", positions shifted by " + std::to_string(r.position_shift);
  }
  return out;
}

json to_json(const CauseReport& r) {
  json rows = json::array();
  for (const RowLayout& x : r.rows) {
    rows.push_back({{"run", x.run},
                    {"batch_size", x.batch_size},
                    {"pad_slots", x.pad_slots},
                    {"position_shift", x.position_shift},
                    {"tokens", x.tokens},
                    {"longest", x.longest}});
  }
  json trials = json::array();
  for (const CauseTrial& t : r.trials) {
    trials.push_back({{"name", t.name},
                      {"policy", t.policy},
                      {"positions", t.positions},
                      {"diverges", t.diverges},
                      {"first", t.first},
                      {"wall_s", t.wall_s}});
  }
  return {{"rows", rows},
          {"trials", trials},
          {"causes", r.causes},
          {"verdict", r.verdict},
          {"wall_s", r.wall_s}};
}

base::Result<CauseReport> causes_from_json(const json& doc) {
  return base::guarded([&]() -> CauseReport {
    const std::string where = "causes";
    if (!doc.is_object()) {
      base::corrupt(where + ": not an object");
    }
    CauseReport r;
    for (const json& x : object_list(doc, "rows", where)) {
      RowLayout row;
      row.run = base::json_field<std::string>(x, "run", where);
      row.batch_size = base::json_field<std::int64_t>(x, "batch_size", where);
      row.pad_slots = base::json_field<std::int64_t>(x, "pad_slots", where);
      row.position_shift = base::json_field<std::int64_t>(x, "position_shift", where);
      row.tokens = base::json_field<std::int64_t>(x, "tokens", where);
      row.longest = base::json_field<std::int64_t>(x, "longest", where);
      r.rows.push_back(std::move(row));
    }
    for (const json& x : object_list(doc, "trials", where)) {
      CauseTrial t;
      t.name = base::json_field<std::string>(x, "name", where);
      t.policy = base::json_field<std::string>(x, "policy", where);
      t.positions = base::json_field<std::string>(x, "positions", where);
      t.diverges = base::json_field<bool>(x, "diverges", where);
      t.first = base::json_field<std::string>(x, "first", where);
      t.wall_s = base::json_field<double>(x, "wall_s", where);
      r.trials.push_back(std::move(t));
    }
    for (const json& x : object_list(doc, "causes", where)) {
      if (!x.is_string()) {
        base::corrupt(where + ": a cause is not a string");
      }
      r.causes.push_back(x.get<std::string>());
    }
    r.verdict = base::json_field<std::string>(doc, "verdict", where);
    r.wall_s = base::json_field<double>(doc, "wall_s", where);
    return r;
  });
}

}  // namespace batchlens::experiment
