// SPDX-License-Identifier: Apache-2.0
// The experiment file's writer and reader. Both visit the field declarations of
// core/experiment/schema.h (FieldWriter, FieldReader); what they add is the file's layout (root
// attributes, groups, the run and comparison lists) and the reader's checks. Arrays are written
// by ArrayWriter (chunk_writer.h).
#include "core/io/experiment_file.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <limits>
#include <mutex>
#include <type_traits>
#include <utility>

#include <H5Cpp.h>
#include <nlohmann/json.hpp>

#include "core/base/input.h"
#include "core/experiment/culprit_report.h"
#include "core/experiment/schema.h"
#include "core/io/chunk_writer.h"
#include "core/io/hdf5_util.h"
#include "core/text/token_diff.h"

namespace batchlens::io {

namespace {

using base::ErrorCode;
using experiment::ComparisonResult;
using experiment::ExperimentResult;
using experiment::NdArray;
using experiment::RunResult;
using experiment::schema::Axis;
using experiment::schema::Opt;
using experiment::schema::Shape;
using experiment::schema::Version;
namespace fs = std::filesystem;
namespace schema = experiment::schema;

// Int members (tick_canvas, steps, ...) are stored as int32.
static_assert(std::is_same_v<int, std::int32_t>, "BatchLens assumes a 32-bit int");

constexpr std::int64_t kMaxElements = std::int64_t{1} << 31;  // per dataset
// Most bytes one file's arrays may take in memory (docs/reliability.md); a file may claim less
// still: at most ~1100 times its size on disk.
constexpr std::uint64_t kMaxReadBytes = std::uint64_t{16} << 30U;

// ---- writing ------------------------------------------------------------------------------

// An H5::Group that holds the only reference to a group id made with the C API.
H5::Group adopt_group(hid_t id, const std::string& what) {
  if (id < 0) {
    base::raise(ErrorCode::IoFailed, "cannot create " + what + ": " + hdf5_error_text());
  }
  H5::Group g(id);  // takes a reference of its own
  H5Idec_ref(id);
  return g;
}

// A group being written: its attributes go through here so that the digest covers them.
class GroupWriter {
 public:
  explicit GroupWriter(const H5::Group& g) : g_(g) {}
  H5::Group& group() { return g_; }

  void str(const std::string& name, const std::string& value) {
    // Fixed-length, NUL-terminated: every byte of the value (NULs and invalid UTF-8 included)
    // and one terminating NUL, so that h5py shows bytes and nothing is cut.
    const H5::StrType type(H5::PredType::C_S1, value.size() + 1);
    type.setStrpad(H5T_STR_NULLTERM);
    type.setCset(H5T_CSET_ASCII);
    std::vector<char> buf(value.begin(), value.end());
    buf.push_back('\0');
    H5::Attribute a = g_.createAttribute(name, type, H5::DataSpace(H5S_SCALAR));
    a.write(type, buf.data());
    digest_.add(name, 's', value.data(), value.size());
  }
  void i64(const std::string& name, std::int64_t value) {
    H5::Attribute a =
        g_.createAttribute(name, H5::PredType::NATIVE_INT64, H5::DataSpace(H5S_SCALAR));
    a.write(H5::PredType::NATIVE_INT64, &value);
    digest_.add(name, 'i', &value, sizeof(value));
  }
  void f64(const std::string& name, double value) {
    H5::Attribute a =
        g_.createAttribute(name, H5::PredType::NATIVE_DOUBLE, H5::DataSpace(H5S_SCALAR));
    a.write(H5::PredType::NATIVE_DOUBLE, &value);
    digest_.add(name, 'f', &value, sizeof(value));
  }
  /// Stores the digest; call once, after the last attribute.
  void seal() {
    const std::uint32_t d = digest_.value();
    H5::Attribute a =
        g_.createAttribute(kDigestAttr, H5::PredType::NATIVE_UINT32, H5::DataSpace(H5S_SCALAR));
    a.write(H5::PredType::NATIVE_UINT32, &d);
  }

 private:
  H5::Group g_;
  AttrDigest digest_;
};

// What a value that the schema stores as JSON text holds.
nlohmann::json as_json(const experiment::ExperimentSpec& spec) {
  return experiment::to_json(spec);
}
nlohmann::json as_json(const std::vector<std::string>& list) {
  return list;
}

// Writes the fields that a schema declaration (core/experiment/schema.h) visits into one group:
// attributes() its single values as the group's attributes, in declaration order; then, after
// the caller sealed the group, arrays() its arrays as datasets. Fields kept in the root group
// (Opt::root) are written only by a FieldWriter of the root group, and only they.
class FieldWriter {
 public:
  FieldWriter(ArrayWriter& arrays, GroupWriter& group, bool root = false)
      : arrays_(arrays), group_(group), root_(root) {}

  template <class S>
  void attributes(const S& s) {
    arrays_pass_ = false;
    schema::visit_fields(s, *this);
  }
  template <class S>
  void arrays(const S& s) {
    arrays_pass_ = true;
    schema::visit_fields(s, *this);
  }

  // The visitor (schema.h).
  template <class T>
  void attr(const char* name, const T& value, const Opt& o = {}) {
    if (arrays_pass_ || !o.stored || o.root != root_) {
      return;
    }
    const std::string key = prefix_ + name;
    if constexpr (std::is_same_v<T, std::string>) {
      group_.str(key, value);
    } else if constexpr (std::is_same_v<T, bool>) {
      group_.i64(key, value ? 1 : 0);
    } else if constexpr (std::is_same_v<T, double>) {
      group_.f64(key, value);
    } else if constexpr (std::is_integral_v<T>) {
      group_.i64(key, value);
    } else if constexpr (std::is_enum_v<T>) {
      group_.str(key, experiment::name(value));  // the vocabulary's text (run_vocabulary.h)
    } else {
      group_.str(key, base::dump_json_lossy(as_json(value)));
    }
  }
  template <class T>
  void array(const char* name, const T& value, const Shape& /*shape: checked by readers*/,
             const Opt& o = {}) {
    if (arrays_pass_ && o.stored) {
      put(prefix_ + name, value);
    }
  }
  template <class S>
  void nested(const char* prefix, const S& s, const Opt& /*o*/) {
    const std::string outer = prefix_;
    prefix_ += prefix;
    schema::visit_fields(s, *this);
    prefix_ = outer;
  }

 private:
  template <class T>
  void put(const std::string& name, const NdArray<T>& a) {
    arrays_.write(group_.group(), name, a.shape, a.data.data());
  }
  template <class T>
  void put(const std::string& name, const std::vector<T>& v) {
    arrays_.write(group_.group(), name, {static_cast<std::int64_t>(v.size())}, v.data());
  }
  void put(const std::string& name, const std::vector<text::TokenEdit>& edits) {
    std::vector<std::int64_t> rows;  // [E, 3] int64: op, reference position, run position
    for (const auto& e : edits) {
      rows.push_back(static_cast<std::int64_t>(e.op));
      rows.push_back(e.ref_pos);
      rows.push_back(e.run_pos);
    }
    arrays_.write(group_.group(), name, {static_cast<std::int64_t>(edits.size()), 3}, rows.data());
  }

  ArrayWriter& arrays_;
  GroupWriter& group_;
  bool root_;
  bool arrays_pass_ = false;
  std::string prefix_;  // of a nested struct's fields
};

// One struct in its group: its single values as attributes, the digest, then its arrays.
template <class S>
void write_fields(ArrayWriter& arrays, GroupWriter& group, const S& s) {
  FieldWriter fields(arrays, group);
  fields.attributes(s);
  group.seal();
  fields.arrays(s);
}

// /runs or /comparisons: a group per item, named by its id, and order_json listing the ids.
template <class Item>
void write_list(ArrayWriter& arrays, GroupWriter& list, const std::vector<Item>& items) {
  nlohmann::json ids = nlohmann::json::array();
  for (const Item& item : items) {
    GroupWriter g(list.group().createGroup(item.id));
    write_fields(arrays, g, item);
    ids.push_back(item.id);
  }
  list.str("order_json", base::dump_json_lossy(ids));
  list.seal();
}

// Every group, dataset and attribute of the file; all of them are closed when it returns.
void write_groups(hid_t fid, const ExperimentResult& r, bool serial) {
  const auto group = [&](const char* name) {
    return GroupWriter(adopt_group(H5Gcreate2(fid, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                                   std::string("/") + name));
  };
  ArrayWriter arrays(serial);
  GroupWriter root(adopt_group(H5Gopen2(fid, "/", H5P_DEFAULT), "/"));
  root.str("format", kFormat);
  root.i64("schema_major", kSchemaMajor);
  root.i64("schema_minor", kSchemaMinor);
  FieldWriter(arrays, root, /*root=*/true).attributes(r.provenance);
  root.seal();
  GroupWriter prov = group("provenance");
  write_fields(arrays, prov, r.provenance);
  GroupWriter cpu = group("provenance/cpu");  // schema 1.3
  write_fields(arrays, cpu, r.provenance.cpu);
  GroupWriter spec = group("spec");
  write_fields(arrays, spec, r);
  GroupWriter runs = group("runs");
  write_list(arrays, runs, r.runs);
  GroupWriter comps = group("comparisons");
  write_list(arrays, comps, r.comparisons);
  // Records kept as one JSON document each, in a group of their own.
  const auto json_group = [&](const char* name, const char* key, const nlohmann::json& doc) {
    GroupWriter g = group(name);
    g.str(key, base::dump_json_lossy(doc));
    g.seal();
  };
  if (r.culprit) {  // schema 1.4: the culprit finder's report, as JSON (experiment/culprit.h)
    json_group("culprit", "report_json", experiment::to_json(*r.culprit));
  }
  if (r.kernels) {  // schema 1.5: kernel provenance, as JSON (experiment/kernels.h)
    json_group("kernels", "provenance_json", experiment::to_json(*r.kernels));
  }
  if (r.causes) {  // schema 1.6: a mixed batch's causes, as JSON (experiment/causes.h)
    json_group("causes", "report_json", experiment::to_json(*r.causes));
  }
  if (r.exact) {  // schema 1.7: the exact reference at each divergence (exact_reference.h)
    json_group("exact", "report_json", experiment::to_json(*r.exact));
  }
}

// ---- reading ------------------------------------------------------------------------------
// Every attribute and dataset is checked for class, rank, shape and element type before it is
// read, into storage sized from the checked shape, within a byte budget set from the file's size
// (a deflated chunk expands at most ~1032 times) and kMaxReadBytes.

bool exists(hid_t g, const std::string& name) {
  return H5Lexists(g, name.c_str(), H5P_DEFAULT) > 0;
}

std::vector<std::string> json_list(const std::string& text, const std::string& what) {
  auto parsed = base::parse_json(text, what, ErrorCode::FileCorrupted);
  if (!parsed.ok()) {
    base::raise(ErrorCode::FileCorrupted, parsed.error().message);
  }
  const nlohmann::json& j = parsed.value();
  if (!j.is_array()) {
    base::corrupt(what + " is not a JSON list");
  }
  std::vector<std::string> out;
  for (const auto& x : j) {
    if (!x.is_string()) {
      base::corrupt(what + " holds a non-string");
    }
    out.push_back(x.get<std::string>());
  }
  return out;
}

// Raises `code` with `prefix` + what: the reader's FileCorrupted naming the file, the writer's
// InvalidArgument before it writes anything.
struct Fail {
  std::string prefix;
  ErrorCode code;
  [[noreturn]] void operator()(const std::string& what) const { base::raise(code, prefix + what); }
};

void check_unique(const Fail& fail, std::vector<std::string> ids, const std::string& what) {
  std::sort(ids.begin(), ids.end());
  const auto dup = std::adjacent_find(ids.begin(), ids.end());
  if (dup != ids.end()) {
    fail(what + " lists '" + *dup + "' twice");
  }
}

class GroupReader;

// The file being read: its name (every message starts with it), its schema version, the bytes
// its arrays may still take; opens groups and datasets, each checked before it is read.
class Reader {
 public:
  Reader(std::string file, std::uint64_t file_bytes)
      : file_(std::move(file)),
        file_bytes_(file_bytes),
        budget_(std::min<std::uint64_t>(kMaxReadBytes, file_bytes * kMaxExpansion + (1U << 20U))) {}

  const std::string& file() const { return file_; }
  std::uint64_t file_bytes() const { return file_bytes_; }
  void set_schema(std::int64_t major, std::int64_t minor) {
    major_ = major;
    minor_ = minor;
  }
  /// Whether the file's schema is `v` or later (false until set_schema).
  bool at_least(Version v) const {
    return major_ > v.major || (major_ == v.major && minor_ >= v.minor);
  }
  /// Schema 1.2 on: fixed-length strings and checksums.
  bool sealed() const { return at_least({1, 2}); }

  [[noreturn]] void fail(const std::string& what) const { base::corrupt(file_ + ": " + what); }

  /// Soft and external links are refused (hdf5_util.h: link_problem).
  void check_hard_link(hid_t parent, const std::string& name, const std::string& at) const {
    if (const std::string p = link_problem(parent, name); !p.empty()) {
      fail(at + " " + p);
    }
  }

  /// Only the layouts and filters BatchLens writes (hdf5_util.h: storage_problem).
  void check_storage(hid_t ds, const std::string& at) const {
    if (const std::string p = storage_problem(ds); !p.empty()) {
      fail(at + " " + p);
    }
  }

  /// Opens a group that must exist.
  GroupReader group(const GroupReader& parent, const std::string& name) const;

  /// A dataset of element type T and the expected shape (-1: any extent), checked before it is
  /// read into storage sized from the checked shape.
  template <class T>
  NdArray<T> nd(const GroupReader& g, const std::string& name,
                const std::vector<std::int64_t>& expect);

 private:
  // Deflate expands at most ~1032:1; shuffle and Fletcher-32 add nothing.
  static constexpr std::uint64_t kMaxExpansion = 1100;

  // The dataset's dimensions, checked against `expect` and the element ceiling.
  std::vector<hsize_t> checked_dims(hid_t ds, const std::string& at,
                                    const std::vector<std::int64_t>& expect) const;

  std::string file_;
  std::uint64_t file_bytes_;
  std::uint64_t budget_;
  std::int64_t major_ = 0;
  std::int64_t minor_ = 0;
};

// A group whose attributes are read through it, then checked against its digest.
class GroupReader {
 public:
  GroupReader(const Reader& rd, hid_t g, std::string where)
      : rd_(rd), g_(g), where_(std::move(where)) {}
  hid_t id() const { return g_.get(); }
  const std::string& where() const { return where_; }
  /// "/spec/@layers": how messages name an attribute.
  std::string at(const std::string& name) const { return where_ + "/@" + name; }

  std::string str(const std::string& name) {
    const Hid a(open(name));
    const Hid type(H5Aget_type(a.get()));
    if (!type.ok() || H5Tget_class(type.get()) != H5T_STRING) {
      rd_.fail(at(name) + " is not a string");
    }
    std::string v;
    if (H5Tis_variable_str(type.get()) > 0) {
      if (rd_.sealed()) {  // files of schema 1.2 on have fixed-length strings only
        rd_.fail(at(name) + " is a variable-length string");
      }
      v = read_vlen(a.get(), name);
    } else {
      v = read_fixed(a.get(), type.get(), name);
    }
    digest_.add(name, 's', v.data(), v.size());
    return v;
  }

  std::int64_t i64(const std::string& name) {
    const Hid a(open(name));
    check_type(a.get(), name, H5T_INTEGER, {1, 2, 4, 8}, "an integer");
    std::int64_t v = 0;
    if (H5Aread(a.get(), H5T_NATIVE_INT64, &v) < 0) {
      rd_.fail(at(name) + " cannot be read (" + hdf5_error_text() + ")");
    }
    digest_.add(name, 'i', &v, sizeof(v));
    return v;
  }

  double f64(const std::string& name) {
    const Hid a(open(name));
    check_type(a.get(), name, H5T_FLOAT, {4, 8}, "a floating-point number");
    double v = 0;
    if (H5Aread(a.get(), H5T_NATIVE_DOUBLE, &v) < 0) {
      rd_.fail(at(name) + " cannot be read (" + hdf5_error_text() + ")");
    }
    digest_.add(name, 'f', &v, sizeof(v));
    return v;
  }

  /// Compares the digest of what was read with the stored one (schema 1.2 on).
  void check_digest() {
    if (!rd_.sealed()) {
      return;
    }
    const Hid a(open(kDigestAttr));
    check_type(a.get(), kDigestAttr, H5T_INTEGER, {4}, "an integer");
    std::uint32_t stored = 0;
    if (H5Aread(a.get(), H5T_NATIVE_UINT32, &stored) < 0) {
      rd_.fail(at(kDigestAttr) + " cannot be read (" + hdf5_error_text() + ")");
    }
    if (stored != digest_.value()) {
      rd_.fail(where_ + ": attributes damaged (their checksum does not match)");
    }
  }

 private:
  // The attribute, checked to hold exactly one value.
  hid_t open(const std::string& name) const {
    if (H5Aexists(g_.get(), name.c_str()) <= 0) {
      rd_.fail(where_ + " lacks the attribute '" + name + "'");
    }
    const hid_t a = H5Aopen(g_.get(), name.c_str(), H5P_DEFAULT);
    if (a < 0) {
      rd_.fail(at(name) + " cannot be opened (" + hdf5_error_text() + ")");
    }
    const Hid space(H5Aget_space(a));
    const H5S_class_t cls = space.ok() ? H5Sget_simple_extent_type(space.get()) : H5S_NO_CLASS;
    const hssize_t points = space.ok() ? H5Sget_simple_extent_npoints(space.get()) : -1;
    if (!(cls == H5S_SCALAR || (cls == H5S_SIMPLE && points == 1))) {
      H5Aclose(a);
      rd_.fail(at(name) + " is not a single value");
    }
    return a;
  }

  void check_type(hid_t a, const std::string& name, H5T_class_t want,
                  std::initializer_list<std::size_t> sizes, const char* what) const {
    const Hid type(H5Aget_type(a));
    const std::size_t size = type.ok() ? H5Tget_size(type.get()) : 0;
    if (!type.ok() || H5Tget_class(type.get()) != want ||
        std::find(sizes.begin(), sizes.end(), size) == sizes.end()) {
      rd_.fail(at(name) + " is not " + what);
    }
  }

  std::string read_fixed(hid_t a, hid_t type, const std::string& name) const {
    const std::size_t size = H5Tget_size(type);
    if (size == 0 || size > rd_.file_bytes()) {
      rd_.fail(at(name) + " claims " + std::to_string(size) + " bytes");
    }
    const Hid mem(H5Tcopy(H5T_C_S1));
    std::vector<char> buf(size);
    if (!mem.ok() || H5Tset_size(mem.get(), size) < 0 ||
        H5Tset_strpad(mem.get(), H5Tget_strpad(type)) < 0 ||
        H5Aread(a, mem.get(), buf.data()) < 0) {
      rd_.fail(at(name) + " cannot be read (" + hdf5_error_text() + ")");
    }
    std::size_t n = size;
    if (H5Tget_strpad(type) == H5T_STR_NULLTERM) {
      n = buf[size - 1] == '\0' ? size - 1 : size;  // our writer: bytes + one NUL
    } else {
      while (n > 0 && buf[n - 1] == '\0') {
        --n;
      }
    }
    return {buf.data(), n};
  }

  std::string read_vlen(hid_t a, const std::string& name) const {
    const Hid mem(H5Tcopy(H5T_C_S1));
    char* p = nullptr;
    if (!mem.ok() || H5Tset_size(mem.get(), H5T_VARIABLE) < 0 ||
        H5Aread(a, mem.get(), static_cast<void*>(&p)) < 0) {
      rd_.fail(at(name) + " cannot be read (" + hdf5_error_text() + ")");
    }
    std::string v = p == nullptr ? std::string() : std::string(p);
    H5free_memory(p);
    return v;
  }

  const Reader& rd_;
  Hid g_;
  std::string where_;
  AttrDigest digest_;
};

GroupReader Reader::group(const GroupReader& parent, const std::string& name) const {
  const std::string where = (parent.where() == "/" ? "" : parent.where()) + "/" + name;
  if (!exists(parent.id(), name)) {
    fail("missing group " + where);
  }
  check_hard_link(parent.id(), name, where);
  const hid_t g = H5Gopen2(parent.id(), name.c_str(), H5P_DEFAULT);
  if (g < 0) {
    fail(where + " cannot be opened (" + hdf5_error_text() + ")");
  }
  return {*this, g, where};
}

// An expected dimension is exact (>= 0), any (-1) or "at most n" (at_most_expect(n) <= -2).
constexpr std::int64_t at_most_expect(std::int64_t n) {
  return -2 - n;
}
constexpr std::int64_t at_most(std::int64_t expect) {
  return expect <= -2 ? -2 - expect : -1;
}

std::vector<hsize_t> Reader::checked_dims(hid_t ds, const std::string& at,
                                          const std::vector<std::int64_t>& expect) const {
  const Hid space(H5Dget_space(ds));
  const int rank = space.ok() ? H5Sget_simple_extent_ndims(space.get()) : -1;
  if (rank != static_cast<int>(expect.size())) {
    fail(at + " has " + std::to_string(rank) + " dimensions, expected " +
         std::to_string(expect.size()));
  }
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  std::uint64_t n = 1;
  for (std::size_t k = 0; k < dims.size(); ++k) {
    if (expect[k] >= 0 && dims[k] != static_cast<hsize_t>(expect[k])) {
      fail(at + " dimension " + std::to_string(k) + " is " + std::to_string(dims[k]) +
           ", expected " + std::to_string(expect[k]));
    }
    if (const std::int64_t most = at_most(expect[k]);
        most >= 0 && dims[k] > static_cast<hsize_t>(most)) {
      fail(at + " dimension " + std::to_string(k) + " is " + std::to_string(dims[k]) +
           ", at most " + std::to_string(most) + " expected");
    }
    if (dims[k] > static_cast<hsize_t>(kMaxElements)) {
      fail(at + " claims an absurd size");
    }
    n *= dims[k];
    if (n > static_cast<std::uint64_t>(kMaxElements)) {
      fail(at + " claims an absurd size");
    }
  }
  return dims;
}

template <class T>
NdArray<T> Reader::nd(const GroupReader& g, const std::string& name,
                      const std::vector<std::int64_t>& expect) {
  const std::string at = g.where() + "/" + name;
  if (!exists(g.id(), name)) {
    fail("missing dataset " + at);
  }
  check_hard_link(g.id(), name, at);
  const Hid ds(H5Dopen2(g.id(), name.c_str(), H5P_DEFAULT));
  if (!ds.ok()) {
    fail(at + " cannot be opened (" + hdf5_error_text() + ")");
  }
  check_storage(ds.get(), at);
  NdArray<T> out;
  std::uint64_t n = 1;
  for (const hsize_t d : checked_dims(ds.get(), at, expect)) {
    n *= d;
    out.shape.push_back(static_cast<std::int64_t>(d));
  }
  const Hid type(H5Dget_type(ds.get()));
  const bool want_float = std::is_floating_point_v<T>;
  const H5T_class_t cls = type.ok() ? H5Tget_class(type.get()) : H5T_NO_CLASS;
  const bool sign_ok = want_float || cls != H5T_INTEGER ||
                       (H5Tget_sign(type.get()) == H5T_SGN_2) == std::is_signed_v<T>;
  if (cls != (want_float ? H5T_FLOAT : H5T_INTEGER) || H5Tget_size(type.get()) != sizeof(T) ||
      !sign_ok) {
    fail(at + " has the wrong element type");
  }
  const std::uint64_t bytes = n * sizeof(T);
  const std::uint64_t stored = H5Dget_storage_size(ds.get());
  if (bytes > budget_ || bytes > stored * kMaxExpansion + (1U << 16U)) {
    fail(at + " claims " + std::to_string(bytes) + " bytes, more than the file can hold (" +
         std::to_string(stored) + " stored)");
  }
  budget_ -= bytes;
  out.data.resize(static_cast<std::size_t>(n));
  if (n > 0 &&
      H5Dread(ds.get(), h5type<T>().getId(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data.data()) < 0) {
    fail(at + " is damaged (" + hdf5_error_text() + ")");
  }
  return out;
}

// The lengths of the axes a group's arrays are checked against (schema::Axis).
struct Extents {
  std::int64_t ticks = -1;  // -1: not known yet (a run's own [S] arrays say)
  std::int64_t canvas = 0;
  std::int64_t layers = 0;
  std::int64_t taps = 0;
  std::int64_t edits = -1;  // a comparison's token diff rows at most; -1: no comparison
};

Extents extents_of(const ExperimentResult& r, std::int64_t ticks) {
  return {ticks, r.canvas_length, r.layers, static_cast<std::int64_t>(r.taps.size())};
}

// Reads the fields that a schema declaration (core/experiment/schema.h) visits from one group.
// attributes(): the single values in declaration order, each checked as it is read; then the
// group's digest; then what waits for the digest (JSON decoding, Opt::plausible ranges), in
// declaration order. arrays(): the arrays, checked against their declared shapes; when the tick
// count is not known yet (a run), the [S] arrays come first and the first of them sets it.
// Fields kept in the root group (Opt::root) are read only by a FieldReader of the root group.
class FieldReader {
 public:
  FieldReader(Reader& rd, GroupReader& g, bool root = false) : rd_(rd), g_(g), root_(root) {}

  template <class S>
  void attributes(S& s) {
    pass_ = Pass::Attributes;
    schema::visit_fields(s, *this);
    g_.check_digest();
    for (const auto& step : after_digest_) {
      step();
    }
    after_digest_.clear();
  }
  template <class S>
  void arrays(S& s, const Extents& x) {
    x_ = x;
    ticks_first_ = x_.ticks < 0;
    if (ticks_first_) {
      pass_ = Pass::TickArrays;
      schema::visit_fields(s, *this);
    }
    pass_ = Pass::Arrays;
    schema::visit_fields(s, *this);
  }

  // The visitor (schema.h).
  template <class T>
  void attr(const char* name, T& value, const Opt& o = {}) {
    if (pass_ != Pass::Attributes || !o.stored || o.root != root_) {
      return;
    }
    const std::string key = prefix_ + name;
    if constexpr (std::is_same_v<T, std::string>) {
      value = g_.str(key);
    } else if constexpr (std::is_same_v<T, bool>) {
      value = g_.i64(key) != 0;
    } else if constexpr (std::is_same_v<T, double>) {
      value = g_.f64(key);
    } else if constexpr (std::is_integral_v<T>) {
      integer(key, g_.i64(key), value, o);
    } else if constexpr (std::is_enum_v<T>) {
      const std::string text = g_.str(key);
      const auto parsed = experiment::enum_from_name(T{}, text);
      if (!parsed.ok()) {
        rd_.fail(g_.at(key) + " has an unknown value");
      }
      value = parsed.value();
    } else {  // JSON text
      after_digest_.emplace_back(
          [this, key, text = g_.str(key), &value] { decode(g_.at(key), text, value); });
    }
  }
  template <class T>
  void array(const char* name, T& value, const Shape& shape, const Opt& o = {}) {
    const bool ticks_only = shape.size() == 1 && shape[0] == Axis::Ticks;
    const bool now = pass_ == Pass::TickArrays
                         ? ticks_only
                         : pass_ == Pass::Arrays && !(ticks_first_ && ticks_only);
    const std::string key = prefix_ + name;
    if (!now || !o.stored || !present(key, o)) {
      return;
    }
    std::vector<std::int64_t> expect;
    for (const Axis a : shape) {
      expect.push_back(extent(a));
    }
    read(key, value, expect);
    if (ticks_only && x_.ticks < 0) {
      x_.ticks = length(value);
    }
  }
  template <class S>
  void nested(const char* prefix, S& s, const Opt& /*o*/) {
    const std::string outer = prefix_;
    prefix_ += prefix;
    schema::visit_fields(s, *this);
    prefix_ = outer;
  }

 private:
  enum class Pass : std::uint8_t { Attributes, TickArrays, Arrays };

  // An integer attribute into a member of type T, within the declared range and T's.
  template <class T>
  void integer(const std::string& key, std::int64_t v, T& value, const Opt& o) {
    const std::int64_t lo = std::max<std::int64_t>(o.lo, std::numeric_limits<T>::min());
    const std::int64_t hi = std::min<std::int64_t>(o.hi, std::numeric_limits<T>::max());
    const auto check = [this, key, v, lo, hi, absurd = o.absurd, &value] {
      if (v < lo || v > hi) {
        rd_.fail(absurd != nullptr ? g_.where() + " has an absurd " + absurd
                                   : g_.at(key) + " is out of range (" + std::to_string(v) + ")");
      }
      value = static_cast<T>(v);
    };
    if (o.absurd != nullptr) {
      after_digest_.emplace_back(check);
    } else {
      check();
    }
  }

  void decode(const std::string& at, const std::string& text, experiment::ExperimentSpec& spec) {
    const auto doc = base::parse_json(text, at, ErrorCode::FileCorrupted);
    if (!doc.ok()) {
      rd_.fail(doc.error().message);
    }
    auto parsed = experiment::spec_from_json(doc.value());
    if (!parsed.ok()) {
      rd_.fail(parsed.error().message);
    }
    spec = parsed.value();
  }
  void decode(const std::string& at, const std::string& text, std::vector<std::string>& list) {
    list = json_list(text, rd_.file() + ": " + at);
  }

  // Whether the file holds the array. Fields of the first schema are in every file; a later one
  // is required in files of its schema on. Files before 1.2 (no checksums) are read as they
  // always were: a field added after 1.0 may be missing, and whether the first field of its
  // addition is there decides for all of them.
  bool present(const std::string& key, const Opt& o) {
    if (!(schema::kFirstSchema < o.added) || rd_.at_least(std::max(o.added, Version{1, 2}))) {
      return true;
    }
    for (const auto& [added, has] : additions_) {
      if (added == o.added) {
        return has;
      }
    }
    const bool has = exists(g_.id(), key);
    additions_.emplace_back(o.added, has);
    return has;
  }

  std::int64_t extent(Axis a) const {
    switch (a) {
      case Axis::Ticks:
        return x_.ticks;
      case Axis::Canvas:
        return x_.canvas;
      case Axis::Layers:
        return x_.layers;
      case Axis::Slots:
        return x_.layers + 1;
      case Axis::Taps:
        return x_.taps;
      case Axis::EditColumns:
        return 3;
      case Axis::Edits:
        return x_.edits >= 0 ? at_most_expect(x_.edits) : -1;
      case Axis::Any:
        break;
    }
    return -1;
  }

  template <class T>
  void read(const std::string& key, NdArray<T>& a, const std::vector<std::int64_t>& expect) {
    a = rd_.nd<T>(g_, key, expect);
  }
  template <class T>
  void read(const std::string& key, std::vector<T>& v, const std::vector<std::int64_t>& expect) {
    v = rd_.nd<T>(g_, key, expect).data;
  }
  void read(const std::string& key, std::vector<text::TokenEdit>& edits,
            const std::vector<std::int64_t>& expect) {
    const NdArray<std::int64_t> rows = rd_.nd<std::int64_t>(g_, key, expect);
    for (std::int64_t i = 0; i < rows.shape[0]; ++i) {
      const std::int64_t op = rows.at({i, 0});
      if (op < 0 || op > 3) {
        rd_.fail(g_.where() + "/" + key + " has an unknown edit " + std::to_string(op));
      }
      edits.push_back({static_cast<text::TokenEdit::Op>(op), rows.at({i, 1}), rows.at({i, 2})});
    }
  }

  template <class T>
  static std::int64_t length(const std::vector<T>& v) {
    return static_cast<std::int64_t>(v.size());
  }
  template <class T>
  static std::int64_t length(const NdArray<T>& a) {
    return a.shape.empty() ? 0 : a.shape[0];
  }

  Reader& rd_;
  GroupReader& g_;
  bool root_;
  Pass pass_ = Pass::Attributes;
  Extents x_;
  bool ticks_first_ = false;
  std::string prefix_;  // of a nested struct's fields
  std::vector<std::function<void()>> after_digest_;
  std::vector<std::pair<Version, bool>> additions_;  // files before 1.2: which they hold
};

RunResult read_run(Reader& rd, const GroupReader& runs, const std::string& id,
                   const ExperimentResult& res) {
  GroupReader g = rd.group(runs, id);
  RunResult r;
  r.id = id;
  FieldReader fields(rd, g);
  fields.attributes(r);
  fields.arrays(r, extents_of(res, -1));  // the run's tick_canvas says how many ticks
  return r;
}

ComparisonResult read_comparison(Reader& rd, const GroupReader& comps, const std::string& id,
                                 const ExperimentResult& res) {
  GroupReader g = rd.group(comps, id);
  ComparisonResult c;
  c.id = id;
  FieldReader fields(rd, g);
  fields.attributes(c);
  const RunResult* ref = res.run(c.reference);
  if (ref == nullptr || res.run(c.run) == nullptr) {
    rd.fail(g.where() + " names a run that is not in /runs");
  }
  Extents x = extents_of(res, static_cast<std::int64_t>(ref->tick_canvas.size()));
  // Each row of a token diff takes at least one token of either run.
  x.edits = static_cast<std::int64_t>(ref->tokens.size() + res.run(c.run)->tokens.size());
  fields.arrays(c, x);
  return c;
}

// /runs or /comparisons: order_json, then each item it lists.
template <class Item, class ReadItem>
void read_list(Reader& rd, const GroupReader& root, const std::string& name, std::vector<Item>& out,
               const ReadItem& read_item) {
  GroupReader list = rd.group(root, name);
  const std::string order = list.str("order_json");
  list.check_digest();
  const std::string what = "/" + name + "/@order_json";
  const auto ids = json_list(order, rd.file() + ": " + what);
  check_unique(Fail{rd.file() + ": ", ErrorCode::FileCorrupted}, ids, what);
  for (const auto& id : ids) {
    out.push_back(read_item(list, id));
  }
}

// The root group: what the file is and its schema version, checked first, then the provenance
// kept there; then whether the groups are there.
void read_root(Reader& rd, GroupReader& root, experiment::Provenance& p) {
  const std::string& file = rd.file();
  const htri_t has_format = H5Aexists(root.id(), "format");
  if (has_format < 0) {
    base::corrupt(file + ": HDF5 cannot read the root group's attributes (damaged: " +
                  hdf5_error_text() + ")");
  }
  if (has_format == 0) {
    base::raise(ErrorCode::FileUnrecognised,
                file + " is an HDF5 file but not a BatchLens experiment (no format=\"" +
                    std::string(kFormat) + "\")");
  }
  const std::int64_t major = root.i64("schema_major");
  const std::int64_t minor = root.i64("schema_minor");
  rd.set_schema(major, minor);
  if (root.str("format") != kFormat) {
    base::raise(ErrorCode::FileUnrecognised,
                file + " is an HDF5 file but not a BatchLens experiment (format is not \"" +
                    std::string(kFormat) + "\")");
  }
  if (major != kSchemaMajor) {
    base::raise(ErrorCode::FileIncompatibleVersion,
                file + " has schema version " + std::to_string(major) + "." +
                    std::to_string(minor) + "; this BatchLens reads version " +
                    std::to_string(kSchemaMajor) + ".x");
  }
  FieldReader(rd, root, /*root=*/true).attributes(p);
  for (const char* g : {"provenance", "spec", "runs", "comparisons"}) {
    if (!exists(root.id(), g)) {
      base::corrupt(file + ": missing group /" + std::string(g));
    }
  }
}

// ---- consistency across datasets, checked once so that every view can trust what it gets ----

// The vocabulary size from the stored config.json (top level or text_config), or int32's range
// when the config does not say (token ids are then only checked to be non-negative ints).
std::int64_t vocab_bound(const std::string& config_json) {
  const auto j = base::parse_json(config_json, "config");
  std::int64_t v = std::numeric_limits<std::int32_t>::max();
  if (j.ok() && j.value().is_object()) {
    const nlohmann::json& doc = j.value();
    const nlohmann::json* p = nullptr;
    if (doc.contains("vocab_size")) {
      p = &doc["vocab_size"];
    } else if (doc.contains("text_config") && doc["text_config"].is_object() &&
               doc["text_config"].contains("vocab_size")) {
      p = &doc["text_config"]["vocab_size"];
    }
    if (p != nullptr && p->is_number_integer() && p->get<std::int64_t>() > 0) {
      v = std::min(v, p->get<std::int64_t>());
    }
  }
  return v;
}

template <class T>
void check_range(const Fail& fail, const std::vector<T>& v, std::int64_t lo, std::int64_t hi,
                 const std::string& what) {
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto x = static_cast<std::int64_t>(v[i]);
    if (x < lo || x >= hi) {
      fail(what + "[" + std::to_string(i) + "] = " + std::to_string(x) + " is out of range [" +
           std::to_string(lo) + ", " + std::to_string(hi) + ")");
    }
  }
}

void validate(const Fail& fail, const ExperimentResult& r) {
  const std::int64_t vocab = vocab_bound(r.config_json);
  const std::int64_t c = r.canvas_length;
  if (r.top_k < 0 || r.top_k > 4096) {
    fail("/spec/@top_k is out of range");
  }
  if (r.taps.size() > 4096) {
    fail("/spec lists more than 4096 taps");
  }
  check_unique(fail, r.taps, "/spec/@taps_json");
  check_range(fail, r.prompt_ids, 0, vocab, "/spec/prompt_ids");
  if (r.runs.empty()) {
    fail("/runs holds no run");
  }
  std::vector<std::string> ids;
  const std::size_t ticks = r.runs.front().tick_canvas.size();
  for (const RunResult& run : r.runs) {
    const std::string at = "/runs/" + run.id;
    ids.push_back(run.id);
    if (run.batch_size < 1 || run.batch_size > (1 << 20)) {
      fail(at + "/@batch_size is out of range (" + std::to_string(run.batch_size) + ")");
    }
    if (run.tick_canvas.size() != ticks) {
      fail(at + " has " + std::to_string(run.tick_canvas.size()) + " ticks, /runs/" +
           r.runs.front().id + " " + std::to_string(ticks) + " (all runs share the ticks)");
    }
    check_range(fail, run.tick_canvas, -1, std::numeric_limits<int>::max(), at + "/tick_canvas");
    check_range(fail, run.tick_step, -1, std::numeric_limits<int>::max(), at + "/tick_step");
    check_range(fail, run.steps, 0, std::numeric_limits<int>::max(), at + "/steps");
    check_range(fail, run.tokens, 0, vocab, at + "/tokens");
    check_range(fail, run.canvas_in.data, -1, vocab, at + "/canvas_in");
    check_range(fail, run.argmax.data, -1, vocab, at + "/argmax");
    check_range(fail, run.sampled.data, -1, vocab, at + "/sampled");
    if (run.stop_position < -1 ||
        run.stop_position > static_cast<std::int64_t>(run.tokens.size())) {
      fail(at + "/@stop_position is out of range (" + std::to_string(run.stop_position) + ")");
    }
  }
  check_unique(fail, ids, "/runs/@order_json");
  ids.clear();
  for (const ComparisonResult& cmp : r.comparisons) {
    const std::string at = "/comparisons/" + cmp.id;
    ids.push_back(cmp.id);
    const RunResult* ref = r.run(cmp.reference);
    const RunResult* run = r.run(cmp.run);
    if (ref == nullptr || run == nullptr) {
      fail(at + " names a run that is not in /runs");
    }
    // row0: row 0 of a run against another run's row 0; rows (lockstep): rows 1.. of a batched
    // run against its own row 0.
    if (cmp.kind == experiment::ComparisonKind::Row0 && cmp.reference == cmp.run) {
      fail(at + " compares run '" + cmp.run + "' with itself");
    }
    if (cmp.kind == experiment::ComparisonKind::Rows &&
        (cmp.reference != cmp.run || run->batch_size < 2)) {
      fail(at + " compares the rows of a batch but names two runs or a run of batch size 1");
    }
    const auto ref_n = static_cast<std::int64_t>(ref->tokens.size());
    const auto run_n = static_cast<std::int64_t>(run->tokens.size());
    const experiment::Divergence& d = cmp.first;
    if (d.tick >= static_cast<int>(ticks) || d.layer > r.layers || d.position >= c ||
        d.position < -1 || (d.found() && (d.canvas < 0 || d.step < 0))) {
      fail(at + ": the first divergence lies outside the experiment");
    }
    if (cmp.tokens_changed < 0 || cmp.tokens_changed > ref_n + run_n) {  // deletions + insertions
      fail(at + "/@tokens_changed is out of range");
    }
    for (const text::TokenEdit& e : cmp.token_diff) {
      if (e.ref_pos < -1 || e.ref_pos >= ref_n || e.run_pos < -1 || e.run_pos >= run_n) {
        fail(at + "/token_diff points outside the runs' tokens");
      }
    }
  }
  check_unique(fail, ids, "/comparisons/@order_json");
}

ExperimentResult read_file(const std::string& file, std::uint64_t file_bytes) {
  Reader rd(file, file_bytes);
  // STRONG: closing the file closes whatever a failed read left open in it.
  const Hid fapl(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG);
  const Hid f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, fapl.get()));
  if (!f.ok()) {
    base::corrupt(file + ": HDF5 cannot open it (truncated or damaged: " + hdf5_error_text() + ")");
  }
  const hid_t root_id = H5Gopen2(f.get(), "/", H5P_DEFAULT);
  if (root_id < 0) {
    base::corrupt(file + ": HDF5 cannot open its root group (damaged: " + hdf5_error_text() + ")");
  }
  GroupReader root(rd, root_id, "/");
  ExperimentResult r;
  read_root(rd, root, r.provenance);
  {
    GroupReader prov = rd.group(root, "provenance");
    FieldReader(rd, prov).attributes(r.provenance);
    if (rd.at_least({1, 3})) {
      GroupReader cpu = rd.group(prov, "cpu");
      FieldReader(rd, cpu).attributes(r.provenance.cpu);
    }
  }
  {
    GroupReader spec = rd.group(root, "spec");
    FieldReader fields(rd, spec);
    fields.attributes(r);
    fields.arrays(r, extents_of(r, -1));
  }
  read_list(rd, root, "runs", r.runs, [&](const GroupReader& runs, const std::string& id) {
    return read_run(rd, runs, id, r);
  });
  read_list(rd, root, "comparisons", r.comparisons,
            [&](const GroupReader& comps, const std::string& id) {
              return read_comparison(rd, comps, id, r);
            });
  // A record kept as one JSON document in a group of its own: parsed as untrusted JSON, then
  // checked field by field by `parse`.
  const auto json_group = [&](const char* name, const char* key, auto parse) {
    GroupReader g = rd.group(root, name);
    const std::string text = g.str(key);
    g.check_digest();
    const std::string at = g.at(key);
    const auto doc = base::parse_json(text, file + ": " + at, ErrorCode::FileCorrupted);
    if (!doc.ok()) {
      base::corrupt(doc.error().message);
    }
    auto record = parse(doc.value());
    if (!record.ok()) {
      base::corrupt(file + ": " + at + ": " + record.error().message);
    }
    return std::move(record).value();
  };
  if (rd.at_least({1, 4}) && exists(root.id(), "culprit")) {
    r.culprit = json_group("culprit", "report_json", [](const nlohmann::json& d) {
      return experiment::culprit_from_json(d);
    });
  }
  if (rd.at_least({1, 5}) && exists(root.id(), "kernels")) {
    r.kernels = json_group("kernels", "provenance_json", [](const nlohmann::json& d) {
      return experiment::kernels_from_json(d);
    });
  }
  if (rd.at_least({1, 6}) && exists(root.id(), "causes")) {
    r.causes = json_group("causes", "report_json",
                          [](const nlohmann::json& d) { return experiment::causes_from_json(d); });
  }
  if (rd.at_least({1, 7}) && exists(root.id(), "exact")) {
    r.exact = json_group("exact", "report_json",
                         [](const nlohmann::json& d) { return experiment::exact_from_json(d); });
  }
  validate(Fail{file + ": ", ErrorCode::FileCorrupted}, r);
  // Files written before issue #34 counted edits (a shifted text's deletions and insertions
  // both), which could exceed the tokens generated: the count is the token diff's, as written
  // now, wherever the file has the diff.
  for (ComparisonResult& cmp : r.comparisons) {
    if (!cmp.token_diff.empty()) {
      cmp.tokens_changed = text::changed_count(cmp.token_diff);
    }
  }
  return r;
}

}  // namespace

WriteOptions WriteOptions::from_environment() {
  // NOLINTBEGIN(concurrency-mt-unsafe): read at the program's edge, before any write starts.
  const char* serial = std::getenv("BATCHLENS_HDF5_SERIAL");
  const char* pause = std::getenv("BATCHLENS_TEST_WRITE_PAUSE_MS");
  // NOLINTEND(concurrency-mt-unsafe)
  WriteOptions o;
  o.serial = serial != nullptr && std::string_view(serial) == "1";
  const long ms = pause != nullptr ? std::strtol(pause, nullptr, 10) : 0;
  o.test_pause_ms = ms > 0 && ms < 600000 ? static_cast<int>(ms) : 0;
  return o;
}

base::Result<void> write_experiment(const fs::path& path, const ExperimentResult& r,
                                    const WriteOptions& options) {
  Hdf5Write how;
  // What the reader would refuse is refused before anything is written.
  how.check = [&] {
    validate(Fail{"the result is inconsistent: ", ErrorCode::InvalidArgument}, r);
  };
  how.fill = [&](hid_t fid) {
    write_groups(fid, r, options.serial);
  };
  how.verify = [](const fs::path& temp) -> base::Result<void> {
    auto back = read_experiment(temp);
    return back.ok() ? base::ok_result() : base::Result<void>(back.error());
  };
  how.test_pause_ms = options.test_pause_ms;
  return write_hdf5_atomic(path, how);
}

base::Result<ExperimentResult> read_experiment(const fs::path& path) {
  auto size = check_hdf5_file(path, "experiment file", "BatchLens experiment files");
  if (!size.ok()) {
    return size.error();
  }
  return base::guarded([&]() -> ExperimentResult {
    const std::lock_guard<std::mutex> lock(hdf5_mutex());
    quiet_hdf5();
    const std::string file = path.string();
    try {
      return read_file(file, size.value());
    } catch (const H5::Exception& e) {
      base::corrupt(file + ": damaged HDF5 data (" + e.getDetailMsg() + ")");
    }
  });
}

}  // namespace batchlens::io
