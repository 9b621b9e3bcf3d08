// SPDX-License-Identifier: Apache-2.0
#include "core/analysis/sweep_records.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/base/atomic_file.h"
#include "core/base/input.h"
#include "core/base/json_field.h"
#include "core/experiment/provenance.h"
#include "core/model/tap_families.h"
#include "core/ops/op_family.h"

namespace batchlens::analysis {

using experiment::ComparisonResult;
using experiment::ExperimentResult;
using experiment::Provenance;
using experiment::RunControl;
using experiment::RunResult;

namespace {

using base::ErrorCode;
using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kSweepFormat = "batchlens-sweep/1";
constexpr const char* kItemFormat = "batchlens-sweep-item/1";
constexpr std::uintmax_t kMaxRecordBytes = std::uintmax_t{64} << 20;

// The whole of a small file, or FileCorrupted when it is larger than `limit`.
std::string read_small(const fs::path& p, std::uintmax_t limit) {
  std::error_code ec;
  const std::uintmax_t size = fs::file_size(p, ec);
  if (ec) {
    base::raise(ErrorCode::IoFailed, p.string() + ": cannot read (" + ec.message() + ")");
  }
  if (size > limit) {
    base::corrupt(p.string() + " is " + std::to_string(size) +
                  " bytes, more than a sweep file holds");
  }
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  if (!in && !in.eof()) {
    base::raise(ErrorCode::IoFailed, p.string() + ": read failed");
  }
  return s.str();
}

json parse_file(const fs::path& p) {
  return base::take(
      base::parse_json(read_small(p, kMaxRecordBytes), p.string(), ErrorCode::FileCorrupted));
}

fs::path item_path(const fs::path& dir, int index) {
  std::ostringstream name;
  name << "item-" << std::setw(6) << std::setfill('0') << index << ".json";
  return dir / "items" / name.str();
}

std::string families_text(const std::string& tap) {
  const ops::FamilySet set = model::families_behind(tap);
  std::string out;
  for (const ops::OpFamily f : ops::all_families()) {
    if (set.test(static_cast<std::size_t>(f))) {
      out += (out.empty() ? "" : "+") + std::string(ops::family_name(f));
    }
  }
  return out;
}

// The rows of a record, checked against its sweep and item.
std::vector<SweepRow> record_rows(const json& doc, const std::string& id, int index,
                                  const std::string& where) {
  if (!doc.is_object() || doc.value("format", std::string()) != kItemFormat) {
    base::corrupt(where + " is not a sweep item record (" + kItemFormat + ")");
  }
  if (base::json_field<std::string>(doc, "sweep_id", where) != id) {
    base::raise(ErrorCode::InvalidArgument, where + " belongs to another sweep");
  }
  if (base::json_field<int>(doc, "item", where) != index) {
    base::corrupt(where + " holds another item");
  }
  const auto rows = doc.find("rows");
  if (rows == doc.end() || !rows->is_array() || rows->size() > 4096) {
    base::corrupt(where + ": 'rows' is not an array of at most 4096 rows");
  }
  std::vector<SweepRow> out;
  for (const json& r : *rows) {
    out.push_back(base::take(sweep_row_from_json(r)));
    if (out.back().item != index) {
      base::corrupt(where + ": a row of another item");
    }
  }
  return out;
}

}  // namespace

std::vector<SweepRow> sweep_rows(const ExperimentResult& r, const SweepItem& item, double wall_s) {
  std::vector<SweepRow> out;
  for (const ComparisonResult& c : r.comparisons) {
    if (c.kind != experiment::ComparisonKind::Row0) {
      continue;
    }
    const RunResult* run = r.run(c.run);
    const RunResult* ref = r.run(c.reference);
    if (run == nullptr || ref == nullptr) {
      continue;
    }
    SweepRow row;
    row.item = item.index;
    row.prompt = item.prompt;
    row.seed = item.seed;
    row.group = run->group;
    row.batch_size = static_cast<int>(run->batch_size);
    row.text_changed = !c.tokens_identical;
    row.tokens_changed = c.tokens_changed;
    row.tokens_total = static_cast<std::int64_t>(ref->tokens.size());
    row.stop_changed = c.stop_changed;
    row.steps_changed = c.steps_changed;
    if (c.first.found()) {
      row.first_canvas = c.first.canvas;
      row.first_step = c.first.step;
      row.first_layer = c.first.layer;
      row.first_tap = c.first.tap;
      row.first_families = families_text(c.first.tap);
    }
    row.wall_s = wall_s;
    out.push_back(std::move(row));
  }
  return out;
}

json to_json(const SweepRow& r) {
  return {{"item", r.item},
          {"prompt", r.prompt},
          {"seed", r.seed},
          {"group", experiment::name(r.group)},
          {"batch_size", r.batch_size},
          {"text_changed", r.text_changed},
          {"tokens_changed", r.tokens_changed},
          {"tokens_total", r.tokens_total},
          {"stop_changed", r.stop_changed},
          {"steps_changed", r.steps_changed},
          {"first_canvas", r.first_canvas},
          {"first_step", r.first_step},
          {"first_layer", r.first_layer},
          {"first_tap", r.first_tap},
          {"first_families", r.first_families},
          {"wall_s", r.wall_s}};
}

base::Result<SweepRow> sweep_row_from_json(const json& doc) {
  return base::guarded([&] {
    const std::string where = "sweep row";
    if (!doc.is_object()) {
      base::corrupt(where + " is not an object");
    }
    SweepRow r;
    r.item = base::json_field<int>(doc, "item", where);
    r.prompt = base::json_field<int>(doc, "prompt", where);
    r.seed = base::json_field<std::uint64_t>(doc, "seed", where);
    const auto group = base::json_field<std::string>(doc, "group", where);
    const auto parsed = experiment::parse_run_group(group);
    if (!parsed.ok()) {
      base::corrupt(where + ": group '" + group.substr(0, 64) + "'");
    }
    r.group = parsed.value();
    r.batch_size = base::json_field<int>(doc, "batch_size", where);
    r.text_changed = base::json_field<bool>(doc, "text_changed", where);
    r.tokens_changed = base::json_field<std::int64_t>(doc, "tokens_changed", where);
    r.tokens_total = base::json_field<std::int64_t>(doc, "tokens_total", where);
    r.stop_changed = base::json_field<bool>(doc, "stop_changed", where);
    r.steps_changed = base::json_field<bool>(doc, "steps_changed", where);
    r.first_canvas = base::json_field<int>(doc, "first_canvas", where);
    r.first_step = base::json_field<int>(doc, "first_step", where);
    r.first_layer = base::json_field<int>(doc, "first_layer", where);
    r.first_tap = base::json_field<std::string>(doc, "first_tap", where);
    r.first_families = base::json_field<std::string>(doc, "first_families", where);
    r.wall_s = base::json_field<double>(doc, "wall_s", where);
    if (r.item < 0 || r.prompt < 0 || r.batch_size < 1 || r.tokens_changed < 0 ||
        r.tokens_total < 0) {
      base::corrupt(where + ": counts out of range");
    }
    return r;
  });
}

fs::path kept_experiment(const fs::path& dir, int item) {
  std::ostringstream name;
  name << "item-" << std::setw(6) << std::setfill('0') << item << ".h5";
  return dir / "experiments" / name.str();
}

base::Result<std::string> prepare_sweep_dir(const fs::path& dir, const SweepSpec& spec) {
  return base::guarded([&] {
    base::take(validate(spec));
    std::string id = sweep_id(spec);
    std::error_code ec;
    fs::create_directories(dir / "items", ec);
    if (ec) {
      base::raise(ErrorCode::IoFailed,
                  dir.string() + ": cannot make the folder (" + ec.message() + ")");
    }
    const fs::path head = dir / "sweep.json";
    if (fs::exists(head, ec)) {
      const json doc = parse_file(head);
      if (!doc.is_object() || doc.value("format", std::string()) != kSweepFormat) {
        base::corrupt(head.string() + " is not a sweep description (" + kSweepFormat + ")");
      }
      if (doc.value("id", std::string()) != id) {
        base::raise(ErrorCode::InvalidArgument,
                    dir.string() + " holds sweep " + doc.value("id", std::string("?")) +
                        ", not this one (" + id +
                        "): another spec, prompts or seeds; choose another folder");
      }
    } else {
      base::take(base::write_file_atomic(
          head, base::dump_json_lossy(
                    json{{"format", kSweepFormat}, {"id", id}, {"spec", to_json(spec)}}, 1) +
                    "\n"));
    }
    return id;
  });
}

base::Result<SweepOutcome> run_sweep(const setup::Session& session, const SweepSpec& spec,
                                     const SweepRunOptions& options, const RunControl& control) {
  return base::guarded([&] {
    if (auto v = validate(spec); !v.ok()) {
      throw base::ErrorException(v.error());
    }
    if (options.shard.count < 1 || options.shard.index < 0 ||
        options.shard.index >= options.shard.count) {
      base::raise(ErrorCode::InvalidArgument, "shard " + std::to_string(options.shard.index) + "/" +
                                                  std::to_string(options.shard.count) +
                                                  ": the index must be below the count");
    }
    SweepOutcome out;
    out.id = sweep_id(spec);
    out.provenance = experiment::provenance_now(spec.base.load, /*emulated=*/false);
    const fs::path& dir = options.dir;
    out.id = base::take(prepare_sweep_dir(dir, spec));
    std::error_code ec;
    std::vector<SweepItem> todo;
    for (const SweepItem& item : sweep_items(spec)) {
      if (!in_shard(item, options.shard)) {
        continue;
      }
      const fs::path rec = item_path(dir, item.index);
      if (fs::exists(rec, ec)) {
        const std::vector<SweepRow> rows =
            record_rows(parse_file(rec), out.id, item.index, rec.string());
        out.rows.insert(out.rows.end(), rows.begin(), rows.end());
        ++out.items_skipped;
      } else {
        todo.push_back(item);
      }
    }
    // Progress over the shard: each item counts 1000 units, its ticks spread over them.
    const auto units = static_cast<std::int64_t>(todo.size()) * 1000;
    base::ProgressClock clock(std::max<std::int64_t>(1, units));
    for (std::size_t i = 0; i < todo.size(); ++i) {
      const SweepItem& item = todo[i];
      RunControl inner;
      inner.cancel = control.cancel;
      inner.load_progress = control.load_progress;
      const std::string stage =
          "item " + std::to_string(i + 1) + "/" + std::to_string(todo.size()) + " (prompt " +
          std::to_string(item.prompt + 1) + ", seed " + std::to_string(item.seed) + ")";
      if (control.progress) {
        inner.progress = [&, i](const base::Progress& p) {
          const auto within = static_cast<std::int64_t>(std::lround(p.fraction() * 1000.0));
          control.progress(
              clock.at(static_cast<std::int64_t>(i) * 1000 + within, stage + ": " + p.stage));
        };
      }
      const auto start = std::chrono::steady_clock::now();
      ExperimentResult r = base::take(run_experiment(session, item_spec(spec, item), inner));
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (options.keep) {
        base::take(options.keep(item, r));
      }
      std::vector<SweepRow> rows = sweep_rows(r, item, wall);
      json rec = {{"format", kItemFormat},
                  {"sweep_id", out.id},
                  {"item", item.index},
                  {"provenance", experiment::provenance_to_json(r.provenance)},
                  {"rows", json::array()}};
      for (const SweepRow& row : rows) {
        rec["rows"].push_back(to_json(row));
      }
      base::take(base::write_file_atomic(item_path(dir, item.index),
                                         base::dump_json_lossy(rec, 1) + "\n"));
      out.provenance = r.provenance;
      out.rows.insert(out.rows.end(), rows.begin(), rows.end());
      ++out.items_run;
    }
    std::sort(out.rows.begin(), out.rows.end(), row_before);
    return out;
  });
}

base::Result<SweepSpec> read_sweep_spec(const fs::path& dir) {
  return base::guarded([&] {
    const fs::path head = dir / "sweep.json";
    std::error_code ec;
    if (!fs::exists(head, ec)) {
      base::raise(ErrorCode::InvalidArgument,
                  dir.string() + " is not a sweep folder (no sweep.json)");
    }
    const json doc = parse_file(head);
    if (!doc.is_object() || doc.value("format", std::string()) != kSweepFormat ||
        !doc.contains("spec")) {
      base::corrupt(head.string() + " is not a sweep description (" + kSweepFormat + ")");
    }
    SweepSpec spec = base::take(sweep_spec_from_json(doc.at("spec")));
    if (doc.value("id", std::string()) != sweep_id(spec)) {
      base::corrupt(head.string() + ": its id does not match its spec");
    }
    return spec;
  });
}

base::Result<SweepRecords> read_sweep_dir(const fs::path& dir) {
  return base::guarded([&] {
    std::error_code ec;
    SweepRecords s;
    s.spec = base::take(read_sweep_spec(dir));
    s.id = sweep_id(s.spec);
    const std::vector<SweepItem> items = sweep_items(s.spec);
    s.items_total = static_cast<int>(items.size());
    for (const SweepItem& item : items) {
      const fs::path rec = item_path(dir, item.index);
      if (!fs::exists(rec, ec)) {
        continue;
      }
      const json doc = parse_file(rec);
      std::vector<SweepRow> rows = record_rows(doc, s.id, item.index, rec.string());
      const auto prov = doc.find("provenance");
      if (prov == doc.end()) {
        base::corrupt(rec.string() + ": no field 'provenance'");
      }
      auto p = experiment::provenance_from_json(*prov);
      if (!p.ok()) {
        base::corrupt(rec.string() + ": " + p.error().message);
      }
      const int at = provenance_index(s.provenances, p.value());
      for (SweepRow& r : rows) {
        r.provenance = at;
      }
      s.rows.insert(s.rows.end(), rows.begin(), rows.end());
      ++s.items_done;
    }
    std::sort(s.rows.begin(), s.rows.end(), row_before);
    return s;
  });
}

// The index of `p` in `list`, appended when it is not there yet.
int provenance_index(std::vector<Provenance>& list, const Provenance& p) {
  const json j = experiment::provenance_to_json(p);
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (experiment::provenance_to_json(list[i]) == j) {
      return static_cast<int>(i);
    }
  }
  list.push_back(p);
  return static_cast<int>(list.size()) - 1;
}

bool row_before(const SweepRow& a, const SweepRow& b) {
  return std::tie(a.item, a.group, a.batch_size) < std::tie(b.item, b.group, b.batch_size);
}

}  // namespace batchlens::analysis
