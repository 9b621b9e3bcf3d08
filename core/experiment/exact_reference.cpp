// SPDX-License-Identifier: Apache-2.0
#include "core/experiment/exact_reference.h"

#include <iomanip>
#include <sstream>
#include <utility>

#include "core/base/json_field.h"

namespace batchlens::experiment {

namespace {

using json = nlohmann::json;

constexpr std::size_t kMaxComparisons = 4096;

ExactDistance distance_from(const json& x, const std::string& where) {
  ExactDistance d;
  if (x.is_null()) {
    return d;
  }
  if (!x.is_object()) {
    base::corrupt(where + ": 'distance' is not an object");
  }
  d.computed = true;
  d.elements = base::json_field<std::int64_t>(x, "elements", where);
  d.max_ulp_one = base::json_field<double>(x, "max_ulp_one", where);
  d.mean_ulp_one = base::json_field<double>(x, "mean_ulp_one", where);
  d.max_ulp_batch = base::json_field<double>(x, "max_ulp_batch", where);
  d.mean_ulp_batch = base::json_field<double>(x, "mean_ulp_batch", where);
  d.max_abs_one = base::json_field<double>(x, "max_abs_one", where);
  d.max_abs_batch = base::json_field<double>(x, "max_abs_batch", where);
  d.closer_one = base::json_field<double>(x, "closer_one", where);
  d.closer_batch = base::json_field<double>(x, "closer_batch", where);
  d.ties = base::json_field<double>(x, "ties", where);
  return d;
}

json op_json(const std::optional<ExactOp>& op) {
  if (!op) {
    return nullptr;
  }
  return {{"site", op->site},
          {"op", op->op},
          {"dtype", op->dtype},
          {"differs_alone", op->differs_alone},
          {"columns", op->columns},
          {"columns_of", op->columns_of},
          {"distance", to_json(op->distance)}};
}

std::optional<ExactOp> op_from(const json& doc, const char* key, const std::string& where) {
  if (!doc.contains(key) || doc.at(key).is_null()) {
    return std::nullopt;
  }
  const json& x = doc.at(key);
  if (!x.is_object()) {
    base::corrupt(where + ": '" + key + "' is not an object");
  }
  ExactOp op;
  op.site = base::json_field<std::string>(x, "site", where);
  op.op = base::json_field<std::string>(x, "op", where);
  op.dtype = base::json_field<std::string>(x, "dtype", where);
  op.differs_alone = base::json_field<bool>(x, "differs_alone", where);
  op.columns = base::json_field<std::int64_t>(x, "columns", where);
  op.columns_of = base::json_field<std::int64_t>(x, "columns_of", where);
  op.distance = distance_from(x.contains("distance") ? x.at("distance") : json(), where);
  return op;
}

std::string percent(double share) {
  std::ostringstream o;
  o << std::setprecision(3) << share * 100.0 << " %";
  return o.str();
}

}  // namespace

json to_json(const ExactDistance& d) {
  if (!d.computed) {
    return nullptr;
  }
  return {{"elements", d.elements},
          {"max_ulp_one", d.max_ulp_one},
          {"mean_ulp_one", d.mean_ulp_one},
          {"max_ulp_batch", d.max_ulp_batch},
          {"mean_ulp_batch", d.mean_ulp_batch},
          {"max_abs_one", d.max_abs_one},
          {"max_abs_batch", d.max_abs_batch},
          {"closer_one", d.closer_one},
          {"closer_batch", d.closer_batch},
          {"ties", d.ties}};
}

std::string ExactDistance::text(std::int64_t batch) const {
  if (!computed) {
    return "not computed";
  }
  const std::string b = "B=" + std::to_string(batch);
  std::ostringstream o;
  o << std::setprecision(3) << "B=1: max " << max_ulp_one << " ULP, mean " << mean_ulp_one << "; "
    << b << ": max " << max_ulp_batch << " ULP, mean " << mean_ulp_batch << "; closer: B=1 on "
    << closer_one * 100.0 << " %, " << b << " on " << closer_batch * 100.0
    << " %, equally close on " << ties * 100.0 << " % of " << elements << " elements";
  return o.str();
}

std::string ExactDistance::closer_text(std::int64_t batch) const {
  if (!computed) {
    return {};
  }
  const std::string b = "B=" + std::to_string(batch);
  if (closer_batch > closer_one) {
    return b + " is closer to exact (on " + percent(closer_batch) + " of elements against " +
           percent(closer_one) + ")";
  }
  if (closer_one > closer_batch) {
    return "B=1 is closer to exact (on " + percent(closer_one) + " of elements against " +
           percent(closer_batch) + ")";
  }
  return "B=1 and " + b + " are as close to exact";
}

const ExactAtDivergence* ExactReport::find(const std::string& comparison) const {
  for (const ExactAtDivergence& c : comparisons) {
    if (c.comparison == comparison) {
      return &c;
    }
  }
  return nullptr;
}

std::string exact_op_text(const ExactOp& op, std::int64_t batch) {
  std::string s = op.site + " (" + op.op + ", " + op.dtype +
                  (op.differs_alone ? ", differs alone" : ", equal alone") + "): ";
  if (!op.distance.computed) {
    return s + "not computed";
  }
  s += op.distance.closer_text(batch) + "; " + op.distance.text(batch);
  if (op.columns < op.columns_of) {
    s += " (" + std::to_string(op.columns) + " of " + std::to_string(op.columns_of) +
         " output columns)";
  }
  return s;
}

std::vector<std::string> exact_lines(const ExactAtDivergence& e) {
  std::vector<std::string> lines;
  if (e.op) {
    lines.push_back("the op: " + exact_op_text(*e.op, e.batch));
  }
  if (e.logits) {
    lines.push_back("the step's logits: " + exact_op_text(*e.logits, e.batch));
  }
  if (!e.note.empty()) {
    lines.push_back("note: " + e.note);
  }
  return lines;
}

json to_json(const ExactReport& report) {
  json list = json::array();
  for (const ExactAtDivergence& c : report.comparisons) {
    list.push_back({{"comparison", c.comparison},
                    {"batch", c.batch},
                    {"canvas", c.canvas},
                    {"step", c.step},
                    {"op", op_json(c.op)},
                    {"logits", op_json(c.logits)},
                    {"note", c.note}});
  }
  return {{"comparisons", std::move(list)}, {"wall_s", report.wall_s}};
}

base::Result<ExactReport> exact_from_json(const json& doc) {
  return base::guarded([&]() -> ExactReport {
    const std::string where = "exact";
    if (!doc.is_object() || !doc.contains("comparisons") || !doc.at("comparisons").is_array() ||
        doc.at("comparisons").size() > kMaxComparisons) {
      base::corrupt(where + ": needs 'comparisons', a list of at most " +
                    std::to_string(kMaxComparisons) + " entries");
    }
    ExactReport r;
    for (const json& x : doc.at("comparisons")) {
      if (!x.is_object()) {
        base::corrupt(where + ": a comparison is not an object");
      }
      ExactAtDivergence c;
      c.comparison = base::json_field<std::string>(x, "comparison", where);
      c.batch = base::json_field<std::int64_t>(x, "batch", where);
      c.canvas = base::json_field<int>(x, "canvas", where);
      c.step = base::json_field<int>(x, "step", where);
      c.op = op_from(x, "op", where);
      c.logits = op_from(x, "logits", where);
      c.note = base::json_field<std::string>(x, "note", where);
      r.comparisons.push_back(std::move(c));
    }
    r.wall_s = base::json_field<double>(doc, "wall_s", where);
    return r;
  });
}

}  // namespace batchlens::experiment
