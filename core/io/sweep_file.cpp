// SPDX-License-Identifier: Apache-2.0
// The sweep file's writer and reader. Layout (docs/file-format.md, "Sweep files"):
//   /               attributes format, schema_major, schema_minor, sweep_id, items_total,
//                   items_done
//   /spec_json      scalar string: the sweep's spec (analysis::to_json(SweepSpec))
//   /rows/<column>  [N] one per row (item × group × batch size): the SweepRow fields
//   /provenance/json [P] strings: the distinct hosts/devices/versions rows were computed with
//   /shards/<column> [S] index, count, provenance, items: the shard files merged here
// Every dataset is chunked with a Fletcher-32 checksum; strings are fixed-length, NUL-terminated.
#include "core/io/sweep_file.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include <H5Cpp.h>
#include <nlohmann/json.hpp>

#include "core/analysis/sweep_merge.h"
#include "core/base/input.h"
#include "core/experiment/provenance.h"
#include "core/io/hdf5_util.h"

namespace batchlens::io {

namespace {

using analysis::SweepRecords;
using analysis::SweepRow;
using analysis::SweepShard;
using base::ErrorCode;
using nlohmann::json;
namespace fs = std::filesystem;

constexpr hsize_t kMaxRows = hsize_t{1} << 24;  // 16 M rows
constexpr std::size_t kMaxStringWidth = std::size_t{1} << 20;
constexpr std::size_t kMaxSpecBytes = std::size_t{256} << 20;

// An integer column of the rows: how it is read from and written to a SweepRow.
struct IntColumn {
  const char* name;
  std::int64_t (*get)(const SweepRow&);
  void (*set)(SweepRow&, std::int64_t);
};

// Every integer column (booleans as 0/1, stored as uint8 in the file).
const std::array<IntColumn, 12>& int_columns() {
  static const std::array<IntColumn, 12> columns{{
      {"item", [](const SweepRow& r) -> std::int64_t { return r.item; },
       [](SweepRow& r, std::int64_t v) {
         r.item = static_cast<int>(v);
       }},
      {"prompt", [](const SweepRow& r) -> std::int64_t { return r.prompt; },
       [](SweepRow& r, std::int64_t v) {
         r.prompt = static_cast<int>(v);
       }},
      {"seed", [](const SweepRow& r) { return static_cast<std::int64_t>(r.seed); },
       [](SweepRow& r, std::int64_t v) {
         r.seed = static_cast<std::uint64_t>(v);
       }},
      {"batch_size", [](const SweepRow& r) -> std::int64_t { return r.batch_size; },
       [](SweepRow& r, std::int64_t v) {
         r.batch_size = static_cast<int>(v);
       }},
      {"tokens_changed", [](const SweepRow& r) { return r.tokens_changed; },
       [](SweepRow& r, std::int64_t v) {
         r.tokens_changed = v;
       }},
      {"tokens_total", [](const SweepRow& r) { return r.tokens_total; },
       [](SweepRow& r, std::int64_t v) {
         r.tokens_total = v;
       }},
      {"first_canvas", [](const SweepRow& r) -> std::int64_t { return r.first_canvas; },
       [](SweepRow& r, std::int64_t v) {
         r.first_canvas = static_cast<int>(v);
       }},
      {"first_step", [](const SweepRow& r) -> std::int64_t { return r.first_step; },
       [](SweepRow& r, std::int64_t v) {
         r.first_step = static_cast<int>(v);
       }},
      {"first_layer", [](const SweepRow& r) -> std::int64_t { return r.first_layer; },
       [](SweepRow& r, std::int64_t v) {
         r.first_layer = static_cast<int>(v);
       }},
      {"provenance", [](const SweepRow& r) -> std::int64_t { return r.provenance; },
       [](SweepRow& r, std::int64_t v) {
         r.provenance = static_cast<int>(v);
       }},
      {"text_changed", [](const SweepRow& r) -> std::int64_t { return r.text_changed ? 1 : 0; },
       [](SweepRow& r, std::int64_t v) {
         r.text_changed = v != 0;
       }},
      {"stop_changed", [](const SweepRow& r) -> std::int64_t { return r.stop_changed ? 1 : 0; },
       [](SweepRow& r, std::int64_t v) {
         r.stop_changed = v != 0;
       }},
  }};
  return columns;
}
constexpr std::size_t kFirstFlagColumn = 10;  // text_changed on: uint8 in the file

struct StrColumn {
  const char* name;
  std::string SweepRow::*member;
};
constexpr std::array<StrColumn, 2> kStrColumns{{
    {"first_tap", &SweepRow::first_tap},
    {"first_families", &SweepRow::first_families},
}};

// ---- writing ------------------------------------------------------------------------------

// A fixed-length, NUL-terminated string type `width` bytes wide.
hid_t string_type(std::size_t width) {
  Hid t(H5Tcopy(H5T_C_S1));
  h5check(!t.ok() ? -1 : H5Tset_size(t.get(), std::max<std::size_t>(1, width)), "string type");
  h5check(H5Tset_strpad(t.get(), H5T_STR_NULLTERM), "string type");
  h5check(H5Tset_cset(t.get(), H5T_CSET_UTF8), "string type");
  H5Iinc_ref(t.get());  // the caller's reference; `t` drops its own
  return t.get();
}

// A 1-D dataset of `n` elements (chunked, Fletcher-32), written from `data` of `mem` type.
void write_1d(hid_t parent, const char* name, hid_t file_type, hid_t mem_type, std::size_t n,
              const void* data) {
  const hsize_t dims = n;
  const hsize_t maxdims = H5S_UNLIMITED;
  const Hid space(H5Screate_simple(1, &dims, &maxdims));
  const Hid dcpl(H5Pcreate(H5P_DATASET_CREATE));
  const hsize_t chunk = std::clamp<hsize_t>(n, 1, 4096);
  h5check(space.ok() && dcpl.ok() ? H5Pset_chunk(dcpl.get(), 1, &chunk) : -1,
          std::string("cannot lay out ") + name);
  h5check(H5Pset_fletcher32(dcpl.get()), std::string("cannot checksum ") + name);
  const Hid ds(
      H5Dcreate2(parent, name, file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
  h5check(ds.ok() ? 0 : -1, std::string("cannot create ") + name);
  if (n > 0) {
    h5check(H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
            std::string("cannot write ") + name);
  }
}

void write_strings(hid_t parent, const char* name, const std::vector<std::string>& values) {
  std::size_t width = 1;
  for (const std::string& v : values) {
    width = std::max(width, v.size() + 1);
  }
  std::vector<char> buf(values.size() * width, '\0');
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::memcpy(buf.data() + i * width, values[i].data(), values[i].size());
  }
  const Hid t(string_type(width));
  write_1d(parent, name, t.get(), t.get(), values.size(), buf.data());
}

void write_ints(hid_t parent, const char* name, const std::vector<std::int64_t>& v, bool flag) {
  if (flag) {
    std::vector<std::uint8_t> bytes(v.begin(), v.end());
    write_1d(parent, name, H5T_STD_U8LE, H5T_NATIVE_UINT8, bytes.size(), bytes.data());
  } else {
    write_1d(parent, name, H5T_STD_I64LE, H5T_NATIVE_INT64, v.size(), v.data());
  }
}

void attr_str(hid_t obj, const char* name, const std::string& value) {
  const Hid t(string_type(value.size() + 1));
  const Hid space(H5Screate(H5S_SCALAR));
  const Hid a(H5Acreate2(obj, name, t.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
  std::vector<char> buf(value.begin(), value.end());
  buf.push_back('\0');
  h5check(a.ok() ? H5Awrite(a.get(), t.get(), buf.data()) : -1,
          std::string("cannot write attribute ") + name);
}

void attr_i64(hid_t obj, const char* name, std::int64_t value) {
  const Hid space(H5Screate(H5S_SCALAR));
  const Hid a(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  h5check(a.ok() ? H5Awrite(a.get(), H5T_NATIVE_INT64, &value) : -1,
          std::string("cannot write attribute ") + name);
}

hid_t make_group(hid_t parent, const char* name) {
  const hid_t g = H5Gcreate2(parent, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  h5check(g < 0 ? -1 : 0, std::string("cannot create group ") + name);
  return g;
}

void write_groups(hid_t fid, const SweepRecords& s) {
  {
    const Hid root(H5Gopen2(fid, "/", H5P_DEFAULT));
    attr_str(root.get(), "format", kSweepFileFormat);
    attr_i64(root.get(), "schema_major", kSweepSchemaMajor);
    attr_i64(root.get(), "schema_minor", kSweepSchemaMinor);
    attr_str(root.get(), "sweep_id", s.id);
    attr_i64(root.get(), "items_total", s.items_total);
    attr_i64(root.get(), "items_done", s.items_done);
  }
  {
    const std::string spec = base::dump_json_lossy(analysis::to_json(s.spec));
    const Hid t(string_type(spec.size() + 1));
    const Hid space(H5Screate(H5S_SCALAR));
    const Hid ds(
        H5Dcreate2(fid, "spec_json", t.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    std::vector<char> buf(spec.begin(), spec.end());
    buf.push_back('\0');
    h5check(ds.ok() ? H5Dwrite(ds.get(), t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) : -1,
            "cannot write spec_json");
  }
  {
    const Hid rows(make_group(fid, "rows"));
    const auto& cols = int_columns();
    for (std::size_t c = 0; c < cols.size(); ++c) {
      std::vector<std::int64_t> v;
      v.reserve(s.rows.size());
      for (const SweepRow& r : s.rows) {
        v.push_back(cols[c].get(r));
      }
      write_ints(rows.get(), cols[c].name, v, c >= kFirstFlagColumn);
    }
    std::vector<std::uint8_t> steps;
    std::vector<double> wall;
    for (const SweepRow& r : s.rows) {
      steps.push_back(r.steps_changed ? 1 : 0);
      wall.push_back(r.wall_s);
    }
    write_1d(rows.get(), "steps_changed", H5T_STD_U8LE, H5T_NATIVE_UINT8, steps.size(),
             steps.data());
    write_1d(rows.get(), "wall_s", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, wall.size(), wall.data());
    std::vector<std::string> groups;
    groups.reserve(s.rows.size());
    for (const SweepRow& r : s.rows) {
      groups.emplace_back(experiment::name(r.group));
    }
    write_strings(rows.get(), "group", groups);
    for (const StrColumn& col : kStrColumns) {
      std::vector<std::string> v;
      v.reserve(s.rows.size());
      for (const SweepRow& r : s.rows) {
        v.push_back(r.*col.member);
      }
      write_strings(rows.get(), col.name, v);
    }
  }
  {
    const Hid prov(make_group(fid, "provenance"));
    std::vector<std::string> docs;
    docs.reserve(s.provenances.size());
    for (const experiment::Provenance& p : s.provenances) {
      docs.push_back(base::dump_json_lossy(experiment::provenance_to_json(p)));
    }
    write_strings(prov.get(), "json", docs);
  }
  {
    const Hid shards(make_group(fid, "shards"));
    std::array<std::vector<std::int64_t>, 4> cols;
    for (const SweepShard& sh : s.shards) {
      cols[0].push_back(sh.index);
      cols[1].push_back(sh.count);
      cols[2].push_back(sh.provenance);
      cols[3].push_back(sh.items);
    }
    const std::array<const char*, 4> names{"index", "count", "provenance", "items"};
    for (std::size_t c = 0; c < cols.size(); ++c) {
      write_ints(shards.get(), names[c], cols[c], false);
    }
  }
}

// ---- reading ------------------------------------------------------------------------------

// Reads one sweep file's objects, each checked before it is read.
class SweepReader {
 public:
  SweepReader(std::string file, std::uint64_t file_bytes)
      : file_(std::move(file)), budget_(file_bytes * 64 + (std::uint64_t{1} << 20)) {}

  [[noreturn]] void fail(const std::string& at, const std::string& what) const {
    base::corrupt(file_ + ": " + at + ": " + what);
  }

  static bool has(hid_t parent, const char* name) {
    return H5Lexists(parent, name, H5P_DEFAULT) > 0;
  }

  hid_t group(hid_t parent, const char* name) const {
    if (!has(parent, name)) {
      fail(name, "missing");
    }
    if (const std::string p = link_problem(parent, name); !p.empty()) {
      fail(name, p);
    }
    const hid_t g = H5Gopen2(parent, name, H5P_DEFAULT);
    if (g < 0) {
      fail(name, "not a group");
    }
    return g;
  }

  // A dataset that must exist, be a hard link of this file and use only what BatchLens writes.
  hid_t dataset(hid_t parent, const char* name) const {
    if (!has(parent, name)) {
      fail(name, "missing");
    }
    if (const std::string p = link_problem(parent, name); !p.empty()) {
      fail(name, p);
    }
    const hid_t ds = H5Dopen2(parent, name, H5P_DEFAULT);
    if (ds < 0) {
      fail(name, "not a dataset");
    }
    if (const std::string p = storage_problem(ds); !p.empty()) {
      H5Idec_ref(ds);
      fail(name, p);
    }
    return ds;
  }

  // A fixed-length string of a scalar attribute or dataset (`is_attr`), at most `limit` bytes.
  std::string scalar_str(hid_t obj, const char* name, bool is_attr, std::size_t limit) const {
    const Hid h(is_attr ? H5Aopen(obj, name, H5P_DEFAULT) : dataset(obj, name));
    if (!h.ok()) {
      fail(name, "missing");
    }
    const Hid type(is_attr ? H5Aget_type(h.get()) : H5Dget_type(h.get()));
    const Hid space(is_attr ? H5Aget_space(h.get()) : H5Dget_space(h.get()));
    if (H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) != 0 ||
        H5Sget_simple_extent_type(space.get()) != H5S_SCALAR) {
      fail(name, "not a fixed-length string");
    }
    const std::size_t size = H5Tget_size(type.get());
    if (size == 0 || size > limit || size > budget_) {
      fail(name, std::to_string(size) + " bytes, more than it may hold");
    }
    std::vector<char> buf(size + 1, '\0');
    const Hid mem(H5Tcopy(type.get()));
    const herr_t st = is_attr
                          ? H5Aread(h.get(), mem.get(), buf.data())
                          : H5Dread(h.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data());
    if (st < 0) {
      fail(name, "unreadable (" + hdf5_error_text() + ")");
    }
    return {buf.data(), strnlen(buf.data(), size)};
  }

  std::int64_t attr_i64(hid_t obj, const char* name) const {
    const Hid a(H5Aopen(obj, name, H5P_DEFAULT));
    if (!a.ok()) {
      fail(name, "missing");
    }
    const Hid type(H5Aget_type(a.get()));
    const Hid space(H5Aget_space(a.get()));
    if (H5Tget_class(type.get()) != H5T_INTEGER ||
        H5Sget_simple_extent_type(space.get()) != H5S_SCALAR) {
      fail(name, "not an integer");
    }
    std::int64_t v = 0;
    if (H5Aread(a.get(), H5T_NATIVE_INT64, &v) < 0) {
      fail(name, "unreadable (" + hdf5_error_text() + ")");
    }
    return v;
  }

  // A 1-D dataset's length, checked: rank 1, the class `cls`, at most kMaxRows, `expect` when
  // it is not -1.
  hsize_t length(hid_t ds, const std::string& at, H5T_class_t cls, std::int64_t expect) const {
    const Hid type(H5Dget_type(ds));
    const Hid space(H5Dget_space(ds));
    if (H5Tget_class(type.get()) != cls ||
        (cls == H5T_STRING && H5Tis_variable_str(type.get()) != 0)) {
      fail(at, "of another element type");
    }
    if (H5Sget_simple_extent_ndims(space.get()) != 1) {
      fail(at, "not one-dimensional");
    }
    hsize_t n = 0;
    H5Sget_simple_extent_dims(space.get(), &n, nullptr);
    if (n > kMaxRows || (expect >= 0 && n != static_cast<hsize_t>(expect))) {
      fail(at, std::to_string(n) + " elements" +
                   (expect >= 0 ? ", not " + std::to_string(expect) : std::string()));
    }
    return n;
  }

  template <class T>
  std::vector<T> numbers(hid_t parent, const char* name, std::int64_t expect, H5T_class_t cls,
                         hid_t mem) const {
    const Hid ds(dataset(parent, name));
    const hsize_t n = length(ds.get(), name, cls, expect);
    spend(n * sizeof(T), name);
    std::vector<T> v(n);
    if (n > 0 && H5Dread(ds.get(), mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0) {
      fail(name, "unreadable or damaged (" + hdf5_error_text() + ")");
    }
    return v;
  }

  std::vector<std::string> strings(hid_t parent, const char* name, std::int64_t expect) const {
    const Hid ds(dataset(parent, name));
    const hsize_t n = length(ds.get(), name, H5T_STRING, expect);
    const Hid type(H5Dget_type(ds.get()));
    const std::size_t width = H5Tget_size(type.get());
    if (width == 0 || width > kMaxStringWidth) {
      fail(name, "strings of " + std::to_string(width) + " bytes");
    }
    spend(n * width, name);
    std::vector<char> buf(n * width);
    const Hid mem(H5Tcopy(type.get()));
    if (n > 0 && H5Dread(ds.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0) {
      fail(name, "unreadable or damaged (" + hdf5_error_text() + ")");
    }
    std::vector<std::string> out;
    out.reserve(n);
    for (hsize_t i = 0; i < n; ++i) {
      const char* p = buf.data() + i * width;
      out.emplace_back(p, strnlen(p, width));
    }
    return out;
  }

 private:
  void spend(std::uint64_t bytes, const char* at) const {
    if (bytes > budget_) {
      fail(at, "claims more data than the file can hold");
    }
    budget_ -= bytes;
  }

  std::string file_;
  mutable std::uint64_t budget_;
};

json parse_doc(const std::string& text, const std::string& what) {
  return base::take(base::parse_json(text, what, ErrorCode::FileCorrupted));
}

void read_rows(const SweepReader& rd, hid_t fid, SweepRecords& s) {
  const Hid rows(rd.group(fid, "rows"));
  const auto items =
      rd.numbers<std::int64_t>(rows.get(), "item", -1, H5T_INTEGER, H5T_NATIVE_INT64);
  const auto n = static_cast<std::int64_t>(items.size());
  s.rows.assign(items.size(), SweepRow{});
  for (const IntColumn& col : int_columns()) {
    const auto v = rd.numbers<std::int64_t>(rows.get(), col.name, n, H5T_INTEGER, H5T_NATIVE_INT64);
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (v[i] < std::numeric_limits<int>::min() || v[i] > std::numeric_limits<int>::max()) {
        if (std::string(col.name) != "seed" && std::string(col.name) != "tokens_changed" &&
            std::string(col.name) != "tokens_total") {
          rd.fail(std::string("rows/") + col.name, "a value out of range");
        }
      }
      col.set(s.rows[i], v[i]);
    }
  }
  const auto steps =
      rd.numbers<std::int64_t>(rows.get(), "steps_changed", n, H5T_INTEGER, H5T_NATIVE_INT64);
  const auto wall = rd.numbers<double>(rows.get(), "wall_s", n, H5T_FLOAT, H5T_NATIVE_DOUBLE);
  for (std::size_t i = 0; i < s.rows.size(); ++i) {
    SweepRow& r = s.rows[i];
    r.steps_changed = steps[i] != 0;
    r.wall_s = wall[i];
    if (r.batch_size < 1 || r.tokens_changed < 0 || r.tokens_total < 0) {
      rd.fail("rows", "row " + std::to_string(i) + ": counts out of range");
    }
  }
  const auto groups = rd.strings(rows.get(), "group", n);
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const auto group = experiment::parse_run_group(groups[i]);
    if (!group.ok()) {
      rd.fail("rows/group", "row " + std::to_string(i) + ": not main or workaround");
    }
    s.rows[i].group = group.value();
  }
  for (const StrColumn& col : kStrColumns) {
    const auto v = rd.strings(rows.get(), col.name, n);
    for (std::size_t i = 0; i < v.size(); ++i) {
      s.rows[i].*col.member = v[i];
    }
  }
}

void read_tables(const SweepReader& rd, hid_t fid, SweepRecords& s, const std::string& file) {
  {
    const Hid prov(rd.group(fid, "provenance"));
    for (const std::string& doc : rd.strings(prov.get(), "json", -1)) {
      auto p = experiment::provenance_from_json(parse_doc(doc, file + ": provenance/json"));
      if (!p.ok()) {
        base::corrupt(file + ": provenance/json: " + p.error().message);
      }
      s.provenances.push_back(std::move(p).value());
    }
  }
  const Hid shards(rd.group(fid, "shards"));
  const auto index =
      rd.numbers<std::int64_t>(shards.get(), "index", -1, H5T_INTEGER, H5T_NATIVE_INT64);
  const auto n = static_cast<std::int64_t>(index.size());
  const auto count =
      rd.numbers<std::int64_t>(shards.get(), "count", n, H5T_INTEGER, H5T_NATIVE_INT64);
  const auto prov =
      rd.numbers<std::int64_t>(shards.get(), "provenance", n, H5T_INTEGER, H5T_NATIVE_INT64);
  const auto items =
      rd.numbers<std::int64_t>(shards.get(), "items", n, H5T_INTEGER, H5T_NATIVE_INT64);
  constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();
  for (std::size_t i = 0; i < index.size(); ++i) {
    if (std::max({index[i], count[i], prov[i], items[i]}) > kIntMax ||
        std::min({index[i], count[i], prov[i], items[i]}) < 0) {
      rd.fail("shards", "shard " + std::to_string(i) + " out of range");
    }
    s.shards.push_back({static_cast<int>(index[i]), static_cast<int>(count[i]),
                        static_cast<int>(prov[i]), static_cast<int>(items[i])});
  }
}

SweepRecords read_records_file(const std::string& file, std::uint64_t file_bytes) {
  const SweepReader rd(file, file_bytes);
  const Hid fapl(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG);
  const Hid f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, fapl.get()));
  if (!f.ok()) {
    base::corrupt(file + ": HDF5 cannot open it (truncated or damaged: " + hdf5_error_text() + ")");
  }
  const Hid root(H5Gopen2(f.get(), "/", H5P_DEFAULT));
  if (!root.ok() || H5Aexists(root.get(), "format") <= 0 ||
      rd.scalar_str(root.get(), "format", true, 256) != kSweepFileFormat) {
    base::raise(ErrorCode::FileUnrecognised, file + " is not a BatchLens sweep file");
  }
  const std::int64_t major = rd.attr_i64(root.get(), "schema_major");
  if (major != kSweepSchemaMajor) {
    base::raise(ErrorCode::FileIncompatibleVersion,
                file + ": sweep schema " + std::to_string(major) + ", this build reads " +
                    std::to_string(kSweepSchemaMajor));
  }
  SweepRecords s;
  s.id = rd.scalar_str(root.get(), "sweep_id", true, 256);
  const std::int64_t total = rd.attr_i64(root.get(), "items_total");
  const std::int64_t done = rd.attr_i64(root.get(), "items_done");
  if (total < 0 || total > std::numeric_limits<int>::max() || done < 0 || done > total) {
    base::corrupt(file + ": items_total/items_done out of range");
  }
  s.items_total = static_cast<int>(total);
  s.items_done = static_cast<int>(done);
  const json spec =
      parse_doc(rd.scalar_str(f.get(), "spec_json", false, kMaxSpecBytes), file + ": spec_json");
  auto parsed = analysis::sweep_spec_from_json(spec);
  if (!parsed.ok()) {
    base::corrupt(file + ": spec_json: " + parsed.error().message);
  }
  s.spec = std::move(parsed).value();
  read_rows(rd, f.get(), s);
  read_tables(rd, f.get(), s, file);
  if (auto v = analysis::validate(s); !v.ok()) {
    base::corrupt(file + ": " + v.error().message);
  }
  return s;
}

}  // namespace

base::Result<void> write_sweep_file(const fs::path& path, const SweepRecords& s) {
  Hdf5Write how;
  how.check = [&] {
    if (auto v = analysis::validate(s); !v.ok()) {
      base::raise(ErrorCode::InvalidArgument, "the records are inconsistent: " + v.error().message);
    }
  };
  how.fill = [&](hid_t fid) {
    write_groups(fid, s);
  };
  how.verify = [](const fs::path& temp) -> base::Result<void> {
    auto back = read_sweep_file(temp);
    return back.ok() ? base::ok_result() : base::Result<void>(back.error());
  };
  return write_hdf5_atomic(path, how);
}

base::Result<SweepRecords> read_sweep_file(const fs::path& path) {
  auto size = check_hdf5_file(path, "sweep file", "BatchLens sweep files");
  if (!size.ok()) {
    return size.error();
  }
  return base::guarded([&]() -> SweepRecords {
    const std::lock_guard<std::mutex> lock(hdf5_mutex());
    quiet_hdf5();
    return read_records_file(path.string(), size.value());
  });
}

bool is_sweep_file(const fs::path& path) {
  if (!check_hdf5_file(path, "sweep file", "BatchLens sweep files").ok()) {
    return false;
  }
  auto kind = base::guarded([&] {
    const std::lock_guard<std::mutex> lock(hdf5_mutex());
    quiet_hdf5();
    const SweepReader rd(path.string(), 0);
    const Hid fapl(H5Pcreate(H5P_FILE_ACCESS));
    H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG);
    const Hid f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()));
    const Hid root(f.ok() ? H5Gopen2(f.get(), "/", H5P_DEFAULT) : -1);
    return root.ok() && H5Aexists(root.get(), "format") > 0 &&
           rd.scalar_str(root.get(), "format", true, 256) == kSweepFileFormat;
  });
  return kind.ok() && kind.value();
}

base::Result<SweepRecords> read_sweep(const fs::path& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) ? analysis::read_sweep_dir(path) : read_sweep_file(path);
}

}  // namespace batchlens::io
