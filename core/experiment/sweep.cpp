// SPDX-License-Identifier: Apache-2.0
#include "core/experiment/sweep.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "core/base/atomic_file.h"
#include "core/base/input.h"
#include "core/base/sha256.h"
#include "core/experiment/culprit.h"
#include "core/experiment/provenance.h"
#include "core/ops/op_family.h"

namespace batchlens::experiment {

namespace {

using base::ErrorCode;
using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kSweepFormat = "batchlens-sweep/1";
constexpr const char* kItemFormat = "batchlens-sweep-item/1";
constexpr std::size_t kMaxItems = 1000000;
constexpr std::size_t kMaxPrompts = 100000;
constexpr std::size_t kMaxSeeds = 100000;
constexpr std::size_t kMaxPromptBytes = std::size_t{1} << 20;
constexpr std::uintmax_t kMaxRecordBytes = std::uintmax_t{64} << 20;

// Throws the error of `r` (base::take for Result<void>).
void check(const base::Result<void>& r) {
  if (!r.ok()) {
    throw base::ErrorException(r.error());
  }
}

[[noreturn]] void corrupt(const std::string& what) {
  base::raise(ErrorCode::FileCorrupted, what);
}

// The whole of a small file, or FileCorrupted when it is larger than `limit`.
std::string read_small(const fs::path& p, std::uintmax_t limit) {
  std::error_code ec;
  const std::uintmax_t size = fs::file_size(p, ec);
  if (ec) {
    base::raise(ErrorCode::IoFailed, p.string() + ": cannot read (" + ec.message() + ")");
  }
  if (size > limit) {
    corrupt(p.string() + " is " + std::to_string(size) + " bytes, more than a sweep file holds");
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

// Typed field access for records that travel: FileCorrupted naming the field.
template <class T>
T field(const json& doc, const char* name, const std::string& where) {
  const auto it = doc.find(name);
  if (it == doc.end()) {
    corrupt(where + ": no field '" + name + "'");
  }
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) {
      corrupt(where + ": '" + name + "' is not a boolean");
    }
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) {
      corrupt(where + ": '" + name + "' is not a string");
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!it->is_number()) {
      corrupt(where + ": '" + name + "' is not a number");
    }
  } else {
    if (!it->is_number_integer()) {
      corrupt(where + ": '" + name + "' is not an integer");
    }
    if constexpr (std::is_unsigned_v<T>) {
      if (it->is_number_unsigned() || it->get<std::int64_t>() >= 0) {
        return it->get<T>();
      }
      corrupt(where + ": '" + name + "' is negative");
    } else {
      const auto v = it->get<std::int64_t>();
      if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) {
        corrupt(where + ": '" + name + "' is out of range");
      }
      return static_cast<T>(v);
    }
  }
  return it->get<T>();
}

fs::path item_path(const fs::path& dir, int index) {
  std::ostringstream name;
  name << "item-" << std::setw(6) << std::setfill('0') << index << ".json";
  return dir / "items" / name.str();
}

std::string families_text(const std::string& tap) {
  const ops::FamilySet set = families_behind(tap);
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
    corrupt(where + " is not a sweep item record (" + kItemFormat + ")");
  }
  if (field<std::string>(doc, "sweep_id", where) != id) {
    base::raise(ErrorCode::InvalidArgument, where + " belongs to another sweep");
  }
  if (field<int>(doc, "item", where) != index) {
    corrupt(where + " holds another item");
  }
  const auto rows = doc.find("rows");
  if (rows == doc.end() || !rows->is_array() || rows->size() > 4096) {
    corrupt(where + ": 'rows' is not an array of at most 4096 rows");
  }
  std::vector<SweepRow> out;
  for (const json& r : *rows) {
    out.push_back(base::take(sweep_row_from_json(r)));
    if (out.back().item != index) {
      corrupt(where + ": a row of another item");
    }
  }
  return out;
}

// The index of `p` in `list`, appended when it is not there yet.
int provenance_index(std::vector<Provenance>& list, const Provenance& p) {
  const json j = provenance_to_json(p);
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (provenance_to_json(list[i]) == j) {
      return static_cast<int>(i);
    }
  }
  list.push_back(p);
  return static_cast<int>(list.size()) - 1;
}

// A row's outcome, without where and how long it ran: what two computations of an item must
// agree on.
json outcome_json(const SweepRow& r) {
  json j = to_json(r);
  j.erase("wall_s");
  return j;
}

bool row_order(const SweepRow& a, const SweepRow& b) {
  return std::tie(a.item, a.group, a.batch_size) < std::tie(b.item, b.group, b.batch_size);
}

}  // namespace

json provenance_to_json(const Provenance& p) {
  return {{"host", p.host},         {"device", p.device},     {"device_name", p.device_name},
          {"driver", p.driver},     {"cuda", p.cuda},         {"cublas", p.cublas},
          {"libtorch", p.libtorch}, {"tool", p.tool_version}, {"dtype", p.dtype}};
}

base::Result<Provenance> provenance_from_json(const json& doc) {
  return base::guarded([&] {
    const std::string where = "provenance";
    if (!doc.is_object()) {
      corrupt(where + " is not an object");
    }
    Provenance p;
    p.host = field<std::string>(doc, "host", where);
    p.device = field<std::string>(doc, "device", where);
    p.device_name = field<std::string>(doc, "device_name", where);
    p.driver = field<std::string>(doc, "driver", where);
    p.cuda = field<std::string>(doc, "cuda", where);
    p.cublas = field<std::string>(doc, "cublas", where);
    p.libtorch = field<std::string>(doc, "libtorch", where);
    p.tool_version = field<std::string>(doc, "tool", where);
    p.dtype = field<std::string>(doc, "dtype", where);
    return p;
  });
}

base::Result<void> validate(const SweepSpec& spec) {
  if (auto v = validate(spec.base); !v.ok()) {
    return v;
  }
  if (spec.prompts.empty()) {
    return base::Error{ErrorCode::InvalidArgument, "a sweep needs at least one prompt"};
  }
  if (spec.seeds.empty()) {
    return base::Error{ErrorCode::InvalidArgument, "a sweep needs at least one seed"};
  }
  if (spec.prompts.size() > kMaxPrompts || spec.seeds.size() > kMaxSeeds ||
      spec.prompts.size() * spec.seeds.size() > kMaxItems) {
    return base::Error{ErrorCode::InvalidArgument, "a sweep has at most " +
                                                       std::to_string(kMaxItems) + " items (" +
                                                       std::to_string(kMaxPrompts) + " prompts, " +
                                                       std::to_string(kMaxSeeds) + " seeds)"};
  }
  for (std::size_t i = 0; i < spec.prompts.size(); ++i) {
    const SweepPrompt& p = spec.prompts[i];
    if (p.ids.empty() && p.text.empty()) {
      return base::Error{ErrorCode::InvalidArgument,
                         "prompt " + std::to_string(i + 1) + " is empty"};
    }
  }
  return base::ok_result();
}

json to_json(const SweepSpec& spec) {
  json prompts = json::array();
  for (const SweepPrompt& p : spec.prompts) {
    json j = {{"prompt", p.text}, {"chat_template", p.chat_template}};
    if (!p.ids.empty()) {
      j["prompt_ids"] = p.ids;
    }
    prompts.push_back(std::move(j));
  }
  return {{"base", to_json(spec.base)}, {"prompts", prompts}, {"seeds", spec.seeds}};
}

base::Result<SweepSpec> sweep_spec_from_json(const json& doc) {
  return base::guarded([&]() -> SweepSpec {
    const std::string where = "sweep spec";
    if (!doc.is_object() || !doc.contains("base") || !doc.contains("prompts") ||
        !doc.contains("seeds")) {
      corrupt(where + ": needs 'base', 'prompts' and 'seeds'");
    }
    SweepSpec s;
    s.base = base::take(spec_from_json(doc.at("base")));
    const json& prompts = doc.at("prompts");
    const json& seeds = doc.at("seeds");
    if (!prompts.is_array() || prompts.size() > kMaxPrompts || !seeds.is_array() ||
        seeds.size() > kMaxSeeds) {
      corrupt(where + ": 'prompts' and 'seeds' must be arrays of at most " +
              std::to_string(kMaxPrompts) + " entries");
    }
    for (const json& p : prompts) {
      if (!p.is_object()) {
        corrupt(where + ": a prompt is not an object");
      }
      SweepPrompt sp;
      sp.text = field<std::string>(p, "prompt", where);
      sp.chat_template = field<bool>(p, "chat_template", where);
      if (const auto ids = p.find("prompt_ids"); ids != p.end()) {
        if (!ids->is_array() || ids->size() > 1000000) {
          corrupt(where + ": 'prompt_ids' is not an array");
        }
        for (const json& id : *ids) {
          if (!id.is_number_integer()) {
            corrupt(where + ": a prompt id is not an integer");
          }
          sp.ids.push_back(id.get<std::int64_t>());
        }
      }
      s.prompts.push_back(std::move(sp));
    }
    s.seeds.clear();
    for (const json& x : seeds) {
      if (!x.is_number_unsigned()) {
        corrupt(where + ": a seed is not a non-negative integer");
      }
      s.seeds.push_back(x.get<std::uint64_t>());
    }
    return s;
  });
}

std::string sweep_id(const SweepSpec& spec) {
  const std::string text = to_json(spec).dump();
  return base::sha256_hex(text.data(), text.size()).substr(0, 16);
}

std::vector<SweepItem> sweep_items(const SweepSpec& spec) {
  std::vector<SweepItem> out;
  out.reserve(spec.prompts.size() * spec.seeds.size());
  for (std::size_t p = 0; p < spec.prompts.size(); ++p) {
    for (const std::uint64_t seed : spec.seeds) {
      out.push_back({static_cast<int>(out.size()), static_cast<int>(p), seed});
    }
  }
  return out;
}

ExperimentSpec item_spec(const SweepSpec& spec, const SweepItem& item) {
  ExperimentSpec s = spec.base;
  const SweepPrompt& p = spec.prompts.at(static_cast<std::size_t>(item.prompt));
  s.prompt = p.text;
  s.chat_template = p.chat_template;
  s.prompt_ids = p.ids;
  s.seed = item.seed;
  s.repeats = 0;
  s.kernels = false;
  return s;
}

bool in_shard(const SweepItem& item, const Shard& shard) {
  return shard.count <= 1 || item.index % shard.count == shard.index;
}

base::Result<std::vector<std::uint64_t>> parse_seeds(const std::string& text) {
  return base::guarded([&] {
    std::set<std::uint64_t> seeds;
    std::stringstream in(text);
    std::string part;
    const auto number = [&](const std::string& s) -> std::uint64_t {
      if (s.empty() || s.size() > 19 ||
          !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        base::raise(ErrorCode::InvalidArgument,
                    "seeds: '" + s + "' is not a number (e.g. 0-23 or 0,5,9-11)");
      }
      return std::stoull(s);
    };
    while (std::getline(in, part, ',')) {
      const std::size_t dash = part.find('-');
      const std::uint64_t lo = number(part.substr(0, dash));
      const std::uint64_t hi = dash == std::string::npos ? lo : number(part.substr(dash + 1));
      if (hi < lo || hi - lo >= kMaxSeeds || seeds.size() + (hi - lo) >= kMaxSeeds) {
        base::raise(ErrorCode::InvalidArgument, "seeds: '" + part + "' is empty or more than " +
                                                    std::to_string(kMaxSeeds) + " seeds");
      }
      for (std::uint64_t s = lo; s <= hi; ++s) {
        seeds.insert(s);
      }
    }
    if (seeds.empty()) {
      base::raise(ErrorCode::InvalidArgument, "seeds: none given (e.g. 0-23)");
    }
    return std::vector<std::uint64_t>(seeds.begin(), seeds.end());
  });
}

base::Result<std::vector<SweepPrompt>> read_prompts(const fs::path& path) {
  return base::guarded([&] {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      base::raise(ErrorCode::InvalidArgument, path.string() + ": cannot open the prompt file");
    }
    std::vector<SweepPrompt> out;
    std::string line;
    int number = 0;
    int jsonl = -1;  // unknown until the first non-empty line
    while (std::getline(in, line)) {
      ++number;
      const std::string where = path.string() + " line " + std::to_string(number);
      if (!line.empty() && line.back() == '\r') {
        line.pop_back();
      }
      if (line.find_first_not_of(" \t") == std::string::npos) {
        continue;
      }
      if (line.size() > kMaxPromptBytes) {
        base::raise(ErrorCode::InvalidArgument, where + " is longer than 1 MiB");
      }
      check(base::check_utf8(line, where));
      if (jsonl < 0) {
        jsonl = line[line.find_first_not_of(" \t")] == '{' ? 1 : 0;
      }
      SweepPrompt p;
      if (jsonl == 1) {
        const json j = base::take(base::parse_json(line, where));
        if (!j.is_object() || (!j.contains("prompt") && !j.contains("prompt_ids"))) {
          base::raise(ErrorCode::InvalidArgument, where + R"(: needs "prompt" or "prompt_ids")");
        }
        if (j.contains("prompt")) {
          if (!j.at("prompt").is_string()) {
            base::raise(ErrorCode::InvalidArgument, where + R"(: "prompt" is not a string)");
          }
          p.text = j.at("prompt").get<std::string>();
        }
        if (j.contains("prompt_ids")) {
          const json& ids = j.at("prompt_ids");
          if (!ids.is_array() || ids.empty() ||
              !std::all_of(ids.begin(), ids.end(),
                           [](const json& x) { return x.is_number_integer(); })) {
            base::raise(ErrorCode::InvalidArgument,
                        where + R"(: "prompt_ids" is not a list of integers)");
          }
          p.ids = ids.get<std::vector<std::int64_t>>();
        }
        if (j.contains("chat_template")) {
          if (!j.at("chat_template").is_boolean()) {
            base::raise(ErrorCode::InvalidArgument,
                        where + R"(: "chat_template" is not true/false)");
          }
          p.chat_template = j.at("chat_template").get<bool>();
        }
      } else {
        p.text = line;
      }
      if (out.size() == kMaxPrompts) {
        base::raise(ErrorCode::InvalidArgument,
                    path.string() + " has more than " + std::to_string(kMaxPrompts) + " prompts");
      }
      out.push_back(std::move(p));
    }
    if (out.empty()) {
      base::raise(ErrorCode::InvalidArgument, path.string() + " holds no prompt");
    }
    return out;
  });
}

std::vector<SweepRow> sweep_rows(const ExperimentResult& r, const SweepItem& item, double wall_s) {
  std::vector<SweepRow> out;
  for (const ComparisonResult& c : r.comparisons) {
    if (c.kind != "row0") {
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
          {"group", r.group},
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
      corrupt(where + " is not an object");
    }
    SweepRow r;
    r.item = field<int>(doc, "item", where);
    r.prompt = field<int>(doc, "prompt", where);
    r.seed = field<std::uint64_t>(doc, "seed", where);
    r.group = field<std::string>(doc, "group", where);
    if (r.group != "main" && r.group != "workaround") {
      corrupt(where + ": group '" + r.group.substr(0, 64) + "'");
    }
    r.batch_size = field<int>(doc, "batch_size", where);
    r.text_changed = field<bool>(doc, "text_changed", where);
    r.tokens_changed = field<std::int64_t>(doc, "tokens_changed", where);
    r.tokens_total = field<std::int64_t>(doc, "tokens_total", where);
    r.stop_changed = field<bool>(doc, "stop_changed", where);
    r.steps_changed = field<bool>(doc, "steps_changed", where);
    r.first_canvas = field<int>(doc, "first_canvas", where);
    r.first_step = field<int>(doc, "first_step", where);
    r.first_layer = field<int>(doc, "first_layer", where);
    r.first_tap = field<std::string>(doc, "first_tap", where);
    r.first_families = field<std::string>(doc, "first_families", where);
    r.wall_s = field<double>(doc, "wall_s", where);
    if (r.item < 0 || r.prompt < 0 || r.batch_size < 1 || r.tokens_changed < 0 ||
        r.tokens_total < 0) {
      corrupt(where + ": counts out of range");
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
    check(validate(spec));
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
        corrupt(head.string() + " is not a sweep description (" + kSweepFormat + ")");
      }
      if (doc.value("id", std::string()) != id) {
        base::raise(ErrorCode::InvalidArgument,
                    dir.string() + " holds sweep " + doc.value("id", std::string("?")) +
                        ", not this one (" + id +
                        "): another spec, prompts or seeds; choose another folder");
      }
    } else {
      check(base::write_file_atomic(
          head,
          json{{"format", kSweepFormat}, {"id", id}, {"spec", to_json(spec)}}.dump(1) + "\n"));
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
    out.provenance = provenance_now(spec.base.load, /*emulated=*/false);
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
        check(options.keep(item, r));
      }
      std::vector<SweepRow> rows = sweep_rows(r, item, wall);
      json rec = {{"format", kItemFormat},
                  {"sweep_id", out.id},
                  {"item", item.index},
                  {"provenance", provenance_to_json(r.provenance)},
                  {"rows", json::array()}};
      for (const SweepRow& row : rows) {
        rec["rows"].push_back(to_json(row));
      }
      check(base::write_file_atomic(item_path(dir, item.index), rec.dump(1) + "\n"));
      out.provenance = r.provenance;
      out.rows.insert(out.rows.end(), rows.begin(), rows.end());
      ++out.items_run;
    }
    std::sort(out.rows.begin(), out.rows.end(), row_order);
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
      corrupt(head.string() + " is not a sweep description (" + kSweepFormat + ")");
    }
    SweepSpec spec = base::take(sweep_spec_from_json(doc.at("spec")));
    if (doc.value("id", std::string()) != sweep_id(spec)) {
      corrupt(head.string() + ": its id does not match its spec");
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
        corrupt(rec.string() + ": no field 'provenance'");
      }
      auto p = provenance_from_json(*prov);
      if (!p.ok()) {
        corrupt(rec.string() + ": " + p.error().message);
      }
      const int at = provenance_index(s.provenances, p.value());
      for (SweepRow& r : rows) {
        r.provenance = at;
      }
      s.rows.insert(s.rows.end(), rows.begin(), rows.end());
      ++s.items_done;
    }
    std::sort(s.rows.begin(), s.rows.end(), row_order);
    return s;
  });
}

base::Result<void> validate(const SweepRecords& s) {
  return base::guarded([&] {
    check(validate(s.spec));
    if (sweep_id(s.spec) != s.id) {
      corrupt("the sweep id " + s.id.substr(0, 32) + " is not its spec's");
    }
    const std::vector<SweepItem> items = sweep_items(s.spec);
    if (s.items_total != static_cast<int>(items.size())) {
      corrupt("items_total " + std::to_string(s.items_total) + " is not the spec's " +
              std::to_string(items.size()));
    }
    // Every item with rows has one per group and batch size of the spec, no other.
    std::set<std::pair<std::string, int>> expected;
    for (const std::int64_t b : s.spec.base.batch_sizes) {
      expected.insert({"main", static_cast<int>(b)});
      if (s.spec.base.workaround) {
        expected.insert({"workaround", static_cast<int>(b)});
      }
    }
    std::map<int, std::set<std::pair<std::string, int>>> seen;
    const auto n_prov = static_cast<int>(s.provenances.size());
    constexpr int kMaxIndex = 1 << 24;
    for (const SweepRow& r : s.rows) {
      const std::string at = "row of item " + std::to_string(r.item);
      if (r.item < 0 || r.item >= s.items_total) {
        corrupt(at + ": no such item");
      }
      const SweepItem& item = items[static_cast<std::size_t>(r.item)];
      if (r.prompt != item.prompt || r.seed != item.seed) {
        corrupt(at + ": its prompt or seed is not the item's");
      }
      if (expected.count({r.group, r.batch_size}) == 0) {
        corrupt(at + ": batch size " + std::to_string(r.batch_size) + " (" + r.group +
                ") is not one of the spec's");
      }
      if (!seen[r.item].insert({r.group, r.batch_size}).second) {
        corrupt(at + ": batch size " + std::to_string(r.batch_size) + " (" + r.group +
                ") comes twice");
      }
      const bool none = r.first_step == -1;
      if (r.provenance < 0 || r.provenance >= n_prov) {
        corrupt(at + ": provenance " + std::to_string(r.provenance) + " out of range");
      }
      if (none ? (r.first_canvas != -1 || r.first_layer != -1)
               : (r.first_step < 1 || r.first_step > kMaxIndex || r.first_canvas < 0 ||
                  r.first_canvas > kMaxIndex || r.first_layer < -1 || r.first_layer > kMaxIndex)) {
        corrupt(at + ": its first divergence is out of range");
      }
    }
    for (const auto& [item, groups] : seen) {
      if (groups != expected) {
        corrupt("item " + std::to_string(item) + " has " + std::to_string(groups.size()) +
                " of its " + std::to_string(expected.size()) + " rows");
      }
    }
    std::set<int> done;
    for (const auto& entry : seen) {
      done.insert(entry.first);
    }
    if (static_cast<int>(done.size()) != s.items_done) {
      corrupt("items_done " + std::to_string(s.items_done) + " but rows of " +
              std::to_string(done.size()) + " items");
    }
    for (const SweepShard& sh : s.shards) {
      if (sh.count < 1 || sh.index < 0 || sh.index >= sh.count || sh.provenance < 0 ||
          sh.provenance >= n_prov || sh.items < 0 || sh.items > s.items_total) {
        corrupt("shard " + std::to_string(sh.index) + "/" + std::to_string(sh.count) +
                ": out of range");
      }
    }
  });
}

SweepRecords shard_records(const SweepRecords& all, const Shard& shard, const Provenance& process) {
  SweepRecords out;
  out.spec = all.spec;
  out.id = all.id;
  out.items_total = all.items_total;
  std::map<int, int> remap;  // provenance index in `all` -> in `out`
  std::set<int> items;
  for (const SweepRow& r : all.rows) {
    if (r.item % shard.count != shard.index) {
      continue;
    }
    SweepRow row = r;
    const auto it = remap.find(r.provenance);
    row.provenance = it != remap.end() ? it->second
                                       : (remap[r.provenance] = provenance_index(
                                              out.provenances, all.provenances.at(r.provenance)));
    items.insert(r.item);
    out.rows.push_back(std::move(row));
  }
  out.items_done = static_cast<int>(items.size());
  out.shards.push_back(
      {shard.index, shard.count, provenance_index(out.provenances, process), out.items_done});
  return out;
}

base::Result<SweepRecords> merge_sweeps(const std::vector<SweepRecords>& parts,
                                        const std::vector<std::string>& names) {
  return base::guarded([&] {
    if (parts.empty() || names.size() != parts.size()) {
      base::raise(ErrorCode::InvalidArgument, "nothing to merge");
    }
    SweepRecords out;
    out.spec = parts.front().spec;
    out.id = parts.front().id;
    out.items_total = parts.front().items_total;
    const json spec = to_json(out.spec);
    std::map<int, std::pair<std::size_t, std::vector<const SweepRow*>>> by_item;  // part, rows
    for (std::size_t p = 0; p < parts.size(); ++p) {
      const SweepRecords& part = parts[p];
      if (part.id != out.id || to_json(part.spec) != spec) {
        base::raise(ErrorCode::InvalidArgument,
                    names[p] + " holds sweep " + part.id + ", not " + out.id + " of " +
                        names.front() + " (another spec, prompts or seeds): not merged");
      }
      for (const SweepShard& sh : part.shards) {
        for (const SweepShard& have : out.shards) {
          if (have.index == sh.index && have.count == sh.count) {
            base::raise(ErrorCode::InvalidArgument,
                        names[p] + ": shard " + std::to_string(sh.index) + "/" +
                            std::to_string(sh.count) + " comes twice among the files");
          }
        }
        SweepShard copy = sh;
        copy.provenance = provenance_index(out.provenances, part.provenances.at(sh.provenance));
        out.shards.push_back(copy);
      }
      std::map<int, std::vector<const SweepRow*>> rows;
      for (const SweepRow& r : part.rows) {
        rows[r.item].push_back(&r);
      }
      for (auto& [item, list] : rows) {
        std::sort(list.begin(), list.end(),
                  [](const SweepRow* a, const SweepRow* b) { return row_order(*a, *b); });
        const auto have = by_item.find(item);
        if (have == by_item.end()) {
          by_item[item] = {p, list};
          continue;
        }
        const auto& old = have->second.second;
        bool same = old.size() == list.size();
        for (std::size_t k = 0; same && k < list.size(); ++k) {
          same = outcome_json(*old[k]) == outcome_json(*list[k]);
        }
        if (!same) {
          base::raise(ErrorCode::InvalidArgument,
                      "item " + std::to_string(item) + " differs between " +
                          names[have->second.first] + " and " + names[p] + ": not merged");
        }
      }
    }
    for (const auto& [item, entry] : by_item) {
      const SweepRecords& part = parts[entry.first];
      for (const SweepRow* r : entry.second) {
        SweepRow row = *r;
        row.provenance = provenance_index(out.provenances, part.provenances.at(r->provenance));
        out.rows.push_back(std::move(row));
      }
    }
    std::sort(out.rows.begin(), out.rows.end(), row_order);
    out.items_done = static_cast<int>(by_item.size());
    return out;
  });
}

std::vector<int> missing_items(const SweepRecords& s) {
  std::set<int> done;
  for (const SweepRow& r : s.rows) {
    done.insert(r.item);
  }
  std::vector<int> out;
  for (int i = 0; i < s.items_total; ++i) {
    if (done.count(i) == 0) {
      out.push_back(i);
    }
  }
  return out;
}

Interval wilson_interval(int k, int n) {
  if (n <= 0) {
    return {0.0, 1.0};
  }
  constexpr double kZ = 1.959963984540054;
  const double nn = n;
  const double p = k / nn;
  const double z2 = kZ * kZ;
  const double centre = (p + z2 / (2 * nn)) / (1 + z2 / nn);
  const double half = kZ * std::sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn)) / (1 + z2 / nn);
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

std::vector<SweepStats> sweep_stats(const std::vector<SweepRow>& rows) {
  std::map<std::pair<std::string, int>, std::vector<const SweepRow*>> by;
  for (const SweepRow& r : rows) {
    by[{r.group, r.batch_size}].push_back(&r);
  }
  std::vector<SweepStats> out;
  for (const auto& [key, group] : by) {
    SweepStats s;
    s.group = key.first;
    s.batch_size = key.second;
    s.n = static_cast<int>(group.size());
    std::vector<std::int64_t> tokens;
    for (const SweepRow* r : group) {
      s.text_changed += r->text_changed ? 1 : 0;
      s.stop_changed += r->stop_changed ? 1 : 0;
      s.steps_changed += r->steps_changed ? 1 : 0;
      tokens.push_back(r->tokens_changed);
      if (r->first_step >= 1) {
        ++s.diverged;
        ++s.first_steps[{r->first_canvas, r->first_step}];
        ++s.first_families[r->first_families.empty() ? "(sampler only)" : r->first_families];
      }
    }
    std::sort(tokens.begin(), tokens.end());
    const std::size_t m = tokens.size();
    s.tokens_changed_median =
        m == 0 ? 0.0
               : (m % 2 == 1 ? static_cast<double>(tokens[m / 2])
                             : (static_cast<double>(tokens[m / 2 - 1]) + tokens[m / 2]) / 2.0);
    s.tokens_changed_max = m == 0 ? 0 : tokens.back();
    s.changed_ci = wilson_interval(s.text_changed, s.n);
    out.push_back(std::move(s));
  }
  // main before workaround, then by batch size
  std::stable_sort(out.begin(), out.end(), [](const SweepStats& a, const SweepStats& b) {
    return std::make_pair(a.group != "main", a.batch_size) <
           std::make_pair(b.group != "main", b.batch_size);
  });
  return out;
}

std::string sweep_text(const SweepRecords& s) {
  std::ostringstream o;
  const ExperimentSpec& b = s.spec.base;
  o << "sweep " << s.id << ": " << b.model.describe() << " on " << b.load.device << " ("
    << b.load.dtype << "), " << s.spec.prompts.size() << " prompt(s) x " << s.spec.seeds.size()
    << " seed(s), " << name(b.mode) << " mode, policy " << ops::policy_text(b.policy)
    << (b.workaround ? ", workaround " + ops::policy_text(*b.workaround) : std::string()) << "\n"
    << "items finished: " << s.items_done << " of " << s.items_total << "\n";
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
  if (!s.shards.empty()) {
    o << "shards:";
    for (const SweepShard& sh : s.shards) {
      o << " " << sh.index << "/" << sh.count << " (" << sh.items << " items, "
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
  for (const SweepStats& st : sweep_stats(s.rows)) {
    o << "\n"
      << (st.group == "main" ? "B=" : "workaround B=") << st.batch_size << ": text changed "
      << st.text_changed << "/" << st.n << " (" << std::setprecision(1)
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
  for (const SweepStats& st : sweep_stats(s.rows)) {
    json steps = json::array();
    for (const auto& [at, count] : st.first_steps) {
      steps.push_back({{"canvas", at.first}, {"step", at.second}, {"items", count}});
    }
    stats.push_back({{"group", st.group},
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
  }
  json rows = json::array();
  for (const SweepRow& r : s.rows) {
    json j = to_json(r);
    j["provenance"] = r.provenance;
    rows.push_back(std::move(j));
  }
  json provenances = json::array();
  for (const Provenance& p : s.provenances) {
    provenances.push_back(provenance_to_json(p));
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

}  // namespace batchlens::experiment
