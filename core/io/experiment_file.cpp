// SPDX-License-Identifier: Apache-2.0
#include "core/io/experiment_file.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include <H5Cpp.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

namespace batchlens::io {

namespace {

using base::ErrorCode;
using experiment::ComparisonResult;
using experiment::ExperimentResult;
using experiment::NdArray;
using experiment::RunResult;
namespace fs = std::filesystem;

// Debian's HDF5 is built without thread safety: one HDF5 call at a time in this process.
std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}

constexpr std::int64_t kMaxElements = std::int64_t{1} << 31;

[[noreturn]] void corrupt(const std::string& what) {
  base::raise(ErrorCode::FileCorrupted, what);
}

template <class T>
const H5::PredType& h5type();
template <>
const H5::PredType& h5type<std::int64_t>() {
  return H5::PredType::NATIVE_INT64;
}
template <>
const H5::PredType& h5type<std::int32_t>() {
  return H5::PredType::NATIVE_INT32;
}
template <>
const H5::PredType& h5type<std::uint8_t>() {
  return H5::PredType::NATIVE_UINT8;
}
template <>
const H5::PredType& h5type<float>() {
  return H5::PredType::NATIVE_FLOAT;
}

// ---- writing ------------------------------------------------------------------------------

void set_str(H5::H5Object& obj, const std::string& name, const std::string& value) {
  const H5::StrType type(H5::PredType::C_S1, H5T_VARIABLE);
  H5::Attribute a = obj.createAttribute(name, type, H5::DataSpace(H5S_SCALAR));
  a.write(type, value);
}

void set_i64(H5::H5Object& obj, const std::string& name, std::int64_t value) {
  H5::Attribute a =
      obj.createAttribute(name, H5::PredType::NATIVE_INT64, H5::DataSpace(H5S_SCALAR));
  a.write(H5::PredType::NATIVE_INT64, &value);
}

void set_f64(H5::H5Object& obj, const std::string& name, double value) {
  H5::Attribute a =
      obj.createAttribute(name, H5::PredType::NATIVE_DOUBLE, H5::DataSpace(H5S_SCALAR));
  a.write(H5::PredType::NATIVE_DOUBLE, &value);
}

// ---- chunked, compressed arrays -----------------------------------------------------------

constexpr std::int64_t kMinChunkedElements = 4096;  // smaller arrays stay contiguous, unfiltered
constexpr hsize_t kMaxChunkElements = hsize_t{1} << 20;
constexpr int kDeflateLevel = 4;
// Raw bytes compressed per batch before their chunks are written: bounds what a huge array holds
// in compressed chunks at once (about this much, a little more if it does not compress at all).
constexpr std::size_t kBatchBytes = std::size_t{64} << 20;
constexpr unsigned kMaxThreads = 16;

// Which chunks a filtered dataset is cut into. One tick (first dimension) per chunk; then leading
// dimensions set to 1 until a chunk holds at most kMaxChunkElements; a last dimension that alone
// is longer is cut to kMaxChunkElements (it used to be cut to 1: a 1-D array of 2M elements got
// 2M chunks of one element). So the chunk is [1, ..., 1, c, dims[split+1], ...]: each chunk is
// one contiguous row-major run of the array, and only dimension `split` has a partial edge chunk.
struct ChunkGrid {
  std::vector<hsize_t> dims;
  std::vector<hsize_t> chunk;
  std::size_t split = 0;  // the one dimension where chunk and dims may differ besides 1s
  hsize_t rows = 1;       // product of dims[0, split)
  hsize_t per_row = 1;    // chunks along dims[split]
  hsize_t inner = 1;      // product of dims(split, rank)

  hsize_t chunk_elements() const { return chunk[split] * inner; }
  hsize_t count() const { return rows * per_row; }
  // Chunk t in HDF5's (row-major) chunk order: its first element and how many it holds.
  std::pair<hsize_t, hsize_t> span(hsize_t t) const {
    const hsize_t r = t / per_row;
    const hsize_t j = t % per_row;
    const hsize_t c = chunk[split];
    return {(r * dims[split] + j * c) * inner, std::min(c, dims[split] - j * c) * inner};
  }
  // Chunk t's offset in elements, what H5Dwrite_chunk takes.
  void offset(hsize_t t, std::vector<hsize_t>& out) const {
    out.assign(dims.size(), 0);
    out[split] = (t % per_row) * chunk[split];
    hsize_t r = t / per_row;
    for (std::size_t k = split; k-- > 0;) {
      out[k] = r % dims[k];
      r /= dims[k];
    }
  }
};

ChunkGrid chunk_grid(const std::vector<hsize_t>& dims) {
  ChunkGrid g;
  g.dims = dims;
  g.chunk = dims;
  const std::size_t rank = dims.size();
  if (rank > 1) {
    g.chunk[0] = 1;
  }
  hsize_t elems = 1;
  for (hsize_t c : g.chunk) {
    elems *= c;
  }
  for (std::size_t k = 0; elems > kMaxChunkElements && k < rank; ++k) {
    elems /= g.chunk[k];
    g.chunk[k] = k + 1 == rank ? kMaxChunkElements : 1;
    elems *= g.chunk[k];
  }
  for (std::size_t k = 0; k < rank; ++k) {
    if (g.chunk[k] < dims[k]) {
      g.split = k;
    }
  }
  for (std::size_t k = 0; k < g.split; ++k) {
    g.rows *= dims[k];
  }
  for (std::size_t k = g.split + 1; k < rank; ++k) {
    g.inner *= dims[k];
  }
  g.per_row = (dims[g.split] + g.chunk[g.split] - 1) / g.chunk[g.split];
  return g;
}

// Per-thread buffers for one chunk, reused from chunk to chunk.
struct ChunkScratch {
  std::vector<unsigned char> shuffled;
  std::vector<unsigned char> packed;
};

// What HDF5's filter pipeline makes of one chunk with shuffle + deflate, so that any reader
// decodes it as before: the chunk padded with zeros to `chunk_elements` (what HDF5 does to edge
// chunks), shuffled as H5Z_filter_shuffle does (byte i of element j goes to i * N + j) and
// compressed as H5Z_filter_deflate does (zlib's compress2, a zlib stream with its header).
// Throws IoFailed when zlib fails.
void shuffle_deflate(const unsigned char* src, std::size_t elements, std::size_t size,
                     std::size_t chunk_elements, ChunkScratch& scratch,
                     std::vector<unsigned char>& out) {
  const std::size_t bytes = chunk_elements * size;
  scratch.shuffled.resize(bytes);
  unsigned char* dst = scratch.shuffled.data();
  for (std::size_t i = 0; i < size; ++i) {
    unsigned char* plane = dst + i * chunk_elements;
    for (std::size_t j = 0; j < elements; ++j) {
      plane[j] = src[j * size + i];
    }
    std::fill(plane + elements, plane + chunk_elements, 0);
  }
  uLongf packed = compressBound(bytes);
  scratch.packed.resize(packed);
  const int status = compress2(scratch.packed.data(), &packed, dst, bytes, kDeflateLevel);
  if (status != Z_OK) {
    base::raise(ErrorCode::IoFailed, std::string("zlib cannot compress a chunk: ") +
                                         zError(status) + " (" + std::to_string(status) + ")");
  }
  out.assign(scratch.packed.begin(), scratch.packed.begin() + static_cast<std::ptrdiff_t>(packed));
}

// Runs job(index, worker) for every index in [0, n) on the calling thread (worker 0) and up to
// max_threads - 1 helper threads (workers 1...), started when first needed and joined by the
// destructor. job may throw: the first exception stops the hand-out of indices and is rethrown
// by run() on the calling thread once every helper is idle again; nothing crosses a thread
// boundary unhandled. run() is called from one thread at a time.
class WorkPool {
 public:
  using Job = std::function<void(std::size_t index, std::size_t worker)>;

  explicit WorkPool(std::size_t max_threads)
      : max_threads_(std::max<std::size_t>(1, max_threads)) {}
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;
  WorkPool(WorkPool&&) = delete;
  WorkPool& operator=(WorkPool&&) = delete;
  ~WorkPool() {
    {
      const std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : helpers_) {
      t.join();
    }
  }

  std::size_t max_threads() const { return max_threads_; }

  void run(std::size_t n, const Job& job) {
    const std::size_t helpers = std::min(max_threads_, n) - (n > 0 ? 1 : 0);
    while (helpers_.size() < helpers) {
      const std::size_t worker = helpers_.size() + 1;
      helpers_.emplace_back([this, worker] { helper_loop(worker); });
    }
    {
      const std::lock_guard<std::mutex> lock(m_);
      job_ = &job;
      n_ = n;
      next_ = 0;
      ++generation_;
    }
    wake_.notify_all();
    work(0);
    std::unique_lock<std::mutex> lock(m_);
    idle_.wait(lock, [this] { return busy_ == 0; });
    job_ = nullptr;
    if (error_) {
      std::exception_ptr e = std::exchange(error_, nullptr);
      std::rethrow_exception(e);
    }
  }

 private:
  void work(std::size_t worker) {
    for (std::size_t i = next_++; i < n_; i = next_++) {
      try {
        (*job_)(i, worker);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(m_);
        if (!error_) {
          error_ = std::current_exception();
        }
        next_ = n_;
      }
    }
  }

  void helper_loop(std::size_t worker) {
    std::uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) {
        return;
      }
      seen = generation_;
      if (job_ == nullptr) {
        continue;  // woke after that run had finished
      }
      ++busy_;
      lock.unlock();
      work(worker);
      lock.lock();
      if (--busy_ == 0) {
        idle_.notify_all();
      }
    }
  }

  const std::size_t max_threads_;
  std::vector<std::thread> helpers_;
  std::mutex m_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  // Set under m_ before a run's wake-up; helpers read job_ and n_ after seeing the new generation.
  const Job* job_ = nullptr;
  std::size_t n_ = 0;
  std::atomic<std::size_t> next_{0};
  std::uint64_t generation_ = 0;
  std::size_t busy_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

// Writes a file's arrays. Arrays of kMinChunkedElements or more are chunked with shuffle +
// deflate; their chunks are shuffled and compressed on a pool of threads and written one after
// another with H5Dwrite_chunk by the calling thread (which holds the HDF5 mutex: the helpers
// never call HDF5). BATCHLENS_HDF5_SERIAL=1 writes them through HDF5's own filter pipeline on one
// thread instead (the same bytes, slower; kept to compare against).
class ArrayWriter {
 public:
  ArrayWriter()
      : serial_(serial_from_env()),
        pool_(std::min(std::max(1U, std::thread::hardware_concurrency()), kMaxThreads)),
        scratch_(pool_.max_threads()) {}

  template <class T>
  void write(H5::Group& g, const std::string& name, const std::vector<std::int64_t>& shape,
             const T* data) {
    std::vector<hsize_t> dims(shape.begin(), shape.end());
    std::int64_t n = 1;
    for (std::int64_t d : shape) {
      n *= d;
    }
    const H5::DataSpace space(static_cast<int>(dims.size()), dims.data());
    H5::DSetCreatPropList plist;
    if (n < kMinChunkedElements) {
      H5::DataSet ds = g.createDataSet(name, h5type<T>(), space, plist);
      if (n > 0) {
        ds.write(data, h5type<T>());
      }
      return;
    }
    // Shuffle + gzip: the arrays are mostly zeros.
    const ChunkGrid grid = chunk_grid(dims);
    plist.setChunk(static_cast<int>(grid.chunk.size()), grid.chunk.data());
    plist.setShuffle();
    plist.setDeflate(kDeflateLevel);
    H5::DataSet ds = g.createDataSet(name, h5type<T>(), space, plist);
    if (serial_) {
      ds.write(data, h5type<T>());
    } else {
      write_chunks(ds, grid, reinterpret_cast<const unsigned char*>(data), sizeof(T));
    }
  }

 private:
  static bool serial_from_env() {
    const char* env = std::getenv("BATCHLENS_HDF5_SERIAL");  // NOLINT(concurrency-mt-unsafe)
    return env != nullptr && std::string(env) == "1";
  }

  void write_chunks(const H5::DataSet& ds, const ChunkGrid& grid, const unsigned char* data,
                    std::size_t size) {
    const hsize_t chunk_elements = grid.chunk_elements();
    const hsize_t per_batch = std::max<hsize_t>(1, kBatchBytes / (chunk_elements * size));
    std::vector<hsize_t> offset;
    for (hsize_t first = 0; first < grid.count(); first += per_batch) {
      const auto count = static_cast<std::size_t>(std::min(per_batch, grid.count() - first));
      packed_.resize(count);
      pool_.run(count, [&](std::size_t i, std::size_t worker) {
        const auto [start, elements] = grid.span(first + i);
        shuffle_deflate(data + start * size, elements, size, chunk_elements, scratch_[worker],
                        packed_[i]);
      });
      for (std::size_t i = 0; i < count; ++i) {
        grid.offset(first + i, offset);
        if (H5Dwrite_chunk(ds.getId(), H5P_DEFAULT, 0, offset.data(), packed_[i].size(),
                           packed_[i].data()) < 0) {
          base::raise(ErrorCode::IoFailed, "HDF5 cannot write chunk " + std::to_string(first + i) +
                                               " of " + ds.getObjName());
        }
      }
    }
    packed_.clear();
  }

  bool serial_;
  WorkPool pool_;
  std::vector<ChunkScratch> scratch_;               // one per pool worker
  std::vector<std::vector<unsigned char>> packed_;  // the batch's compressed chunks
};

template <class T>
void write_nd(ArrayWriter& w, H5::Group& g, const std::string& name, const NdArray<T>& a) {
  w.write(g, name, a.shape, a.data.data());
}

template <class T>
void write_vec(ArrayWriter& w, H5::Group& g, const std::string& name, const std::vector<T>& v) {
  w.write(g, name, {static_cast<std::int64_t>(v.size())}, v.data());
}

void write_run(ArrayWriter& w, H5::Group& runs, const RunResult& r) {
  H5::Group g = runs.createGroup(r.id);
  set_i64(g, "batch_size", r.batch_size);
  set_str(g, "group", r.group);
  set_str(g, "policy_json", r.policy_json);
  set_str(g, "policy_text", r.policy_text);
  set_i64(g, "emulated", r.emulated ? 1 : 0);
  set_f64(g, "wall_time_s", r.wall_time_s);
  set_i64(g, "stop_position", r.stop_position);
  set_str(g, "text", r.text);
  write_nd(w, g, "canvas_in", r.canvas_in);
  write_nd(w, g, "argmax", r.argmax);
  write_nd(w, g, "sampled", r.sampled);
  write_nd(w, g, "accepted", r.accepted);
  write_nd(w, g, "entropy", r.entropy);
  write_vec(w, g, "tick_canvas",
            std::vector<std::int32_t>(r.tick_canvas.begin(), r.tick_canvas.end()));
  write_vec(w, g, "tick_step", std::vector<std::int32_t>(r.tick_step.begin(), r.tick_step.end()));
  write_vec(w, g, "tokens", r.tokens);
  write_vec(w, g, "steps", std::vector<std::int32_t>(r.steps.begin(), r.steps.end()));
}

void write_comparison(ArrayWriter& w, H5::Group& comps, const ComparisonResult& c) {
  H5::Group g = comps.createGroup(c.id);
  set_str(g, "reference", c.reference);
  set_str(g, "run", c.run);
  set_str(g, "kind", c.kind);
  set_i64(g, "tokens_identical", c.tokens_identical ? 1 : 0);
  set_i64(g, "tokens_changed", c.tokens_changed);
  set_i64(g, "stop_changed", c.stop_changed ? 1 : 0);
  set_i64(g, "steps_changed", c.steps_changed ? 1 : 0);
  set_i64(g, "first_tick", c.first.tick);
  set_i64(g, "first_canvas", c.first.canvas);
  set_i64(g, "first_step", c.first.step);
  set_i64(g, "first_layer", c.first.layer);
  set_str(g, "first_tap", c.first.tap);
  set_i64(g, "first_position", c.first.position);
  write_nd(w, g, "frac_differ", c.frac_differ);
  write_nd(w, g, "max_abs", c.max_abs);
  write_nd(w, g, "max_ulp", c.max_ulp);
  write_vec(w, g, "compared", c.compared);
  if (c.kind == "row0") {
    write_nd(w, g, "pos_frac_differ", c.pos_frac_differ);
    write_nd(w, g, "pos_max_abs", c.pos_max_abs);
    write_nd(w, g, "pos_max_ulp", c.pos_max_ulp);
    write_nd(w, g, "routing_flips", c.routing_flips);
    write_nd(w, g, "router_margin", c.router_margin);
    write_nd(w, g, "sampler_diff", c.sampler_diff);
    std::vector<std::int64_t> edits;
    for (const auto& e : c.token_diff) {
      edits.push_back(static_cast<std::int64_t>(e.op));
      edits.push_back(e.ref_pos);
      edits.push_back(e.run_pos);
    }
    w.write(g, "token_diff", {static_cast<std::int64_t>(c.token_diff.size()), 3}, edits.data());
  }
}

void fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// ---- reading ------------------------------------------------------------------------------

bool exists(const H5::Group& g, const std::string& name) {
  return H5Lexists(g.getId(), name.c_str(), H5P_DEFAULT) > 0;
}

struct Reader {
  std::string file;

  H5::Attribute attr(const H5::H5Object& obj, const std::string& where,
                     const std::string& name) const {
    if (H5Aexists(obj.getId(), name.c_str()) <= 0) {
      corrupt(file + ": " + where + " lacks the attribute '" + name + "'");
    }
    return obj.openAttribute(name);
  }
  std::string str(const H5::H5Object& obj, const std::string& where,
                  const std::string& name) const {
    H5::Attribute a = attr(obj, where, name);
    if (a.getTypeClass() != H5T_STRING) {
      corrupt(file + ": " + where + "/@" + name + " is not a string");
    }
    std::string v;
    a.read(a.getStrType(), v);
    return v;
  }
  std::int64_t i64(const H5::H5Object& obj, const std::string& where,
                   const std::string& name) const {
    H5::Attribute a = attr(obj, where, name);
    if (a.getTypeClass() != H5T_INTEGER) {
      corrupt(file + ": " + where + "/@" + name + " is not an integer");
    }
    std::int64_t v = 0;
    a.read(H5::PredType::NATIVE_INT64, &v);
    return v;
  }
  double f64(const H5::H5Object& obj, const std::string& where, const std::string& name) const {
    H5::Attribute a = attr(obj, where, name);
    double v = 0;
    a.read(H5::PredType::NATIVE_DOUBLE, &v);
    return v;
  }

  template <class T>
  NdArray<T> nd(const H5::Group& g, const std::string& where, const std::string& name,
                std::vector<std::int64_t> expect) const {
    if (!exists(g, name)) {
      corrupt(file + ": missing dataset " + where + "/" + name);
    }
    H5::DataSet ds = g.openDataSet(name);
    const H5::DataSpace space = ds.getSpace();
    const int rank = space.getSimpleExtentNdims();
    if (rank != static_cast<int>(expect.size())) {
      corrupt(file + ": " + where + "/" + name + " has " + std::to_string(rank) +
              " dimensions, expected " + std::to_string(expect.size()));
    }
    std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
    space.getSimpleExtentDims(dims.data());
    NdArray<T> out;
    std::int64_t n = 1;
    for (int k = 0; k < rank; ++k) {
      const auto d = static_cast<std::int64_t>(dims[static_cast<std::size_t>(k)]);
      if (expect[static_cast<std::size_t>(k)] >= 0 && d != expect[static_cast<std::size_t>(k)]) {
        std::string m = file;
        m.append(": ").append(where).append("/").append(name).append(" dimension ");
        m.append(std::to_string(k)).append(" is ").append(std::to_string(d));
        m.append(", expected ").append(std::to_string(expect[static_cast<std::size_t>(k)]));
        corrupt(m);
      }
      out.shape.push_back(d);
      n *= d;
      if (n > kMaxElements) {
        std::string m = file;
        m.append(": ").append(where).append("/").append(name).append(" claims an absurd size");
        corrupt(m);
      }
    }
    const H5T_class_t cls = ds.getTypeClass();
    const bool want_float = std::is_floating_point_v<T>;
    if ((cls == H5T_FLOAT) != want_float || (cls != H5T_FLOAT && cls != H5T_INTEGER)) {
      corrupt(file + ": " + where + "/" + name + " has the wrong element type");
    }
    out.data.resize(static_cast<std::size_t>(n));
    if (n > 0) {
      ds.read(out.data.data(), h5type<T>());
    }
    return out;
  }

  template <class T, class V = T>
  std::vector<V> vec(const H5::Group& g, const std::string& where, const std::string& name,
                     std::int64_t expect = -1) const {
    const NdArray<T> a = nd<T>(g, where, name, {expect});
    return std::vector<V>(a.data.begin(), a.data.end());
  }
};

RunResult read_run(const Reader& rd, const H5::Group& runs, const std::string& id, std::int64_t c) {
  const std::string where = "/runs/" + id;
  if (!exists(runs, id)) {
    corrupt(rd.file + ": missing group " + where);
  }
  const H5::Group g = runs.openGroup(id);
  RunResult r;
  r.id = id;
  r.batch_size = rd.i64(g, where, "batch_size");
  r.group = rd.str(g, where, "group");
  r.policy_json = rd.str(g, where, "policy_json");
  r.policy_text = rd.str(g, where, "policy_text");
  r.emulated = rd.i64(g, where, "emulated") != 0;
  r.wall_time_s = rd.f64(g, where, "wall_time_s");
  r.stop_position = rd.i64(g, where, "stop_position");
  r.text = rd.str(g, where, "text");
  r.tick_canvas = rd.vec<std::int32_t, int>(g, where, "tick_canvas");
  const auto s = static_cast<std::int64_t>(r.tick_canvas.size());
  r.tick_step = rd.vec<std::int32_t, int>(g, where, "tick_step", s);
  r.canvas_in = rd.nd<std::int64_t>(g, where, "canvas_in", {s, c});
  r.argmax = rd.nd<std::int64_t>(g, where, "argmax", {s, c});
  r.sampled = rd.nd<std::int64_t>(g, where, "sampled", {s, c});
  r.accepted = rd.nd<std::uint8_t>(g, where, "accepted", {s, c});
  r.entropy = rd.nd<float>(g, where, "entropy", {s, c});
  r.tokens = rd.vec<std::int64_t>(g, where, "tokens");
  r.steps = rd.vec<std::int32_t, int>(g, where, "steps");
  return r;
}

ComparisonResult read_comparison(const Reader& rd, const H5::Group& comps, const std::string& id,
                                 const ExperimentResult& res) {
  const std::string where = "/comparisons/" + id;
  if (!exists(comps, id)) {
    corrupt(rd.file + ": missing group " + where);
  }
  const H5::Group g = comps.openGroup(id);
  ComparisonResult c;
  c.id = id;
  c.reference = rd.str(g, where, "reference");
  c.run = rd.str(g, where, "run");
  c.kind = rd.str(g, where, "kind");
  if (c.kind != "row0" && c.kind != "rows") {
    corrupt(rd.file + ": " + where + " has the unknown kind '" + c.kind + "'");
  }
  c.tokens_identical = rd.i64(g, where, "tokens_identical") != 0;
  c.tokens_changed = rd.i64(g, where, "tokens_changed");
  c.stop_changed = rd.i64(g, where, "stop_changed") != 0;
  c.steps_changed = rd.i64(g, where, "steps_changed") != 0;
  c.first.tick = static_cast<int>(rd.i64(g, where, "first_tick"));
  c.first.canvas = static_cast<int>(rd.i64(g, where, "first_canvas"));
  c.first.step = static_cast<int>(rd.i64(g, where, "first_step"));
  c.first.layer = static_cast<int>(rd.i64(g, where, "first_layer"));
  c.first.tap = rd.str(g, where, "first_tap");
  c.first.position = rd.i64(g, where, "first_position");
  const RunResult* ref = res.run(c.reference);
  if (ref == nullptr || res.run(c.run) == nullptr) {
    corrupt(rd.file + ": " + where + " names a run that is not in /runs");
  }
  const auto s = static_cast<std::int64_t>(ref->tick_canvas.size());
  const std::int64_t slots = res.layers + 1;
  const auto t = static_cast<std::int64_t>(res.taps.size());
  c.frac_differ = rd.nd<float>(g, where, "frac_differ", {s, slots, t});
  c.max_abs = rd.nd<float>(g, where, "max_abs", {s, slots, t});
  c.max_ulp = rd.nd<float>(g, where, "max_ulp", {s, slots, t});
  c.compared = rd.vec<std::uint8_t>(g, where, "compared", s);
  if (c.kind == "row0") {
    c.pos_frac_differ = rd.nd<float>(g, where, "pos_frac_differ", {s, slots, t, res.canvas_length});
    if (exists(g, "pos_max_abs")) {  // schema 1.1
      c.pos_max_abs = rd.nd<float>(g, where, "pos_max_abs", {s, slots, t, res.canvas_length});
      c.pos_max_ulp = rd.nd<float>(g, where, "pos_max_ulp", {s, slots, t, res.canvas_length});
    }
    c.routing_flips =
        rd.nd<std::uint8_t>(g, where, "routing_flips", {s, res.layers, res.canvas_length});
    c.router_margin = rd.nd<float>(g, where, "router_margin", {s, res.layers, res.canvas_length});
    c.sampler_diff = rd.nd<std::uint8_t>(g, where, "sampler_diff", {s, res.canvas_length});
    const NdArray<std::int64_t> edits = rd.nd<std::int64_t>(g, where, "token_diff", {-1, 3});
    for (std::int64_t i = 0; i < edits.shape[0]; ++i) {
      const std::int64_t op = edits.at({i, 0});
      if (op < 0 || op > 3) {
        corrupt(rd.file + ": " + where + "/token_diff has an unknown edit " + std::to_string(op));
      }
      c.token_diff.push_back(
          {static_cast<text::TokenEdit::Op>(op), edits.at({i, 1}), edits.at({i, 2})});
    }
  }
  return c;
}

std::vector<std::string> json_list(const std::string& text, const std::string& what) {
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_array()) {
    corrupt(what + " is not a JSON list");
  }
  std::vector<std::string> out;
  for (const auto& x : j) {
    if (!x.is_string()) {
      corrupt(what + " holds a non-string");
    }
    out.push_back(x.get<std::string>());
  }
  return out;
}

}  // namespace

base::Result<void> write_experiment(const fs::path& path, const ExperimentResult& r) {
  static std::atomic<int> counter{0};
  const fs::path temp =
      path.string() + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  auto result = base::guarded([&] {
    const std::lock_guard<std::mutex> lock(hdf5_mutex());
    H5::Exception::dontPrint();
    {
      ArrayWriter arrays;
      H5::H5File f(temp.string(), H5F_ACC_EXCL);
      H5::Group root = f.openGroup("/");
      set_str(root, "format", kFormat);
      set_i64(root, "schema_major", kSchemaMajor);
      set_i64(root, "schema_minor", kSchemaMinor);
      set_str(root, "tool_version", r.provenance.tool_version);
      set_str(root, "created_utc", r.provenance.created_utc);

      H5::Group prov = f.createGroup("provenance");
      const auto& p = r.provenance;
      for (const auto& [k, v] :
           std::vector<std::pair<const char*, std::string>>{{"host", p.host},
                                                            {"device", p.device},
                                                            {"device_name", p.device_name},
                                                            {"driver", p.driver},
                                                            {"cuda", p.cuda},
                                                            {"cublas", p.cublas},
                                                            {"libtorch", p.libtorch},
                                                            {"blas", p.blas},
                                                            {"dtype", p.dtype}}) {
        set_str(prov, k, v);
      }
      set_i64(prov, "threads", p.threads);
      set_i64(prov, "emulated", p.emulated ? 1 : 0);

      H5::Group spec = f.createGroup("spec");
      set_str(spec, "spec_json", experiment::to_json(r.spec).dump());
      set_str(spec, "config_json", r.config_json);
      set_str(spec, "generation_config_json", r.generation_config_json);
      set_str(spec, "prompt_text", r.prompt_text);
      set_str(spec, "taps_json", nlohmann::json(r.taps).dump());
      set_i64(spec, "layers", r.layers);
      set_i64(spec, "canvas_length", r.canvas_length);
      set_i64(spec, "top_k", r.top_k);
      write_vec(arrays, spec, "prompt_ids", r.prompt_ids);

      H5::Group runs = f.createGroup("runs");
      nlohmann::json run_ids = nlohmann::json::array();
      for (const auto& run : r.runs) {
        write_run(arrays, runs, run);
        run_ids.push_back(run.id);
      }
      set_str(runs, "order_json", run_ids.dump());
      H5::Group comps = f.createGroup("comparisons");
      nlohmann::json comp_ids = nlohmann::json::array();
      for (const auto& c : r.comparisons) {
        write_comparison(arrays, comps, c);
        comp_ids.push_back(c.id);
      }
      set_str(comps, "order_json", comp_ids.dump());
      f.close();
    }
    fsync_path(temp);
    std::error_code ec;
    fs::rename(temp, path, ec);
    if (ec) {
      base::raise(ErrorCode::IoFailed,
                  path.string() + ": cannot rename into place: " + ec.message());
    }
    fsync_path(path.has_parent_path() ? path.parent_path() : fs::path("."));
  });
  if (!result.ok()) {
    std::error_code ec;
    fs::remove(temp, ec);
    return base::Error{
        result.error().code == ErrorCode::Internal ? ErrorCode::IoFailed : result.error().code,
        "cannot write " + path.string() + ": " + result.error().message};
  }
  return result;
}

base::Result<ExperimentResult> read_experiment(const fs::path& path) {
  {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return base::Error{ErrorCode::FileNotFound, "cannot open " + path.string()};
    }
    std::array<char, 8> sig{};
    in.read(sig.data(), sig.size());
    if (in.gcount() != 8 || std::memcmp(sig.data(), "\x89HDF\r\n\x1a\n", 8) != 0) {
      return base::Error{ErrorCode::FileUnrecognised,
                         path.string() + " is not an HDF5 file (BatchLens experiment files are)"};
    }
  }
  return base::guarded([&]() -> ExperimentResult {
    const std::lock_guard<std::mutex> lock(hdf5_mutex());
    H5::Exception::dontPrint();
    const std::string file = path.string();
    Reader rd{file};
    H5::H5File f;
    try {
      f.openFile(file, H5F_ACC_RDONLY);
    } catch (const H5::Exception&) {
      corrupt(file + ": HDF5 cannot open it (truncated or damaged)");
    }
    try {
      const H5::Group root = f.openGroup("/");
      if (H5Aexists(root.getId(), "format") <= 0 || rd.str(root, "/", "format") != kFormat) {
        base::raise(ErrorCode::FileUnrecognised,
                    file + " is an HDF5 file but not a BatchLens experiment (no format=\"" +
                        std::string(kFormat) + "\")");
      }
      const std::int64_t major = rd.i64(root, "/", "schema_major");
      if (major != kSchemaMajor) {
        base::raise(ErrorCode::FileIncompatibleVersion,
                    file + " has schema version " + std::to_string(major) + "." +
                        std::to_string(rd.i64(root, "/", "schema_minor")) +
                        "; this BatchLens reads version " + std::to_string(kSchemaMajor) + ".x");
      }
      ExperimentResult r;
      for (const char* g : {"provenance", "spec", "runs", "comparisons"}) {
        if (!exists(root, g)) {
          corrupt(file + ": missing group /" + std::string(g));
        }
      }
      const H5::Group prov = f.openGroup("provenance");
      auto& p = r.provenance;
      p.tool_version = rd.str(root, "/", "tool_version");
      p.created_utc = rd.str(root, "/", "created_utc");
      p.host = rd.str(prov, "/provenance", "host");
      p.device = rd.str(prov, "/provenance", "device");
      p.device_name = rd.str(prov, "/provenance", "device_name");
      p.driver = rd.str(prov, "/provenance", "driver");
      p.cuda = rd.str(prov, "/provenance", "cuda");
      p.cublas = rd.str(prov, "/provenance", "cublas");
      p.libtorch = rd.str(prov, "/provenance", "libtorch");
      p.blas = rd.str(prov, "/provenance", "blas");
      p.dtype = rd.str(prov, "/provenance", "dtype");
      p.threads = rd.i64(prov, "/provenance", "threads");
      p.emulated = rd.i64(prov, "/provenance", "emulated") != 0;

      const H5::Group spec = f.openGroup("spec");
      const auto spec_doc =
          nlohmann::json::parse(rd.str(spec, "/spec", "spec_json"), nullptr, false);
      if (spec_doc.is_discarded()) {
        corrupt(file + ": /spec/@spec_json is not JSON");
      }
      auto parsed = experiment::spec_from_json(spec_doc);
      if (!parsed.ok()) {
        corrupt(file + ": " + parsed.error().message);
      }
      r.spec = parsed.value();
      r.config_json = rd.str(spec, "/spec", "config_json");
      r.generation_config_json = rd.str(spec, "/spec", "generation_config_json");
      r.prompt_text = rd.str(spec, "/spec", "prompt_text");
      r.taps = json_list(rd.str(spec, "/spec", "taps_json"), file + ": /spec/@taps_json");
      r.layers = static_cast<int>(rd.i64(spec, "/spec", "layers"));
      r.canvas_length = rd.i64(spec, "/spec", "canvas_length");
      r.top_k = rd.i64(spec, "/spec", "top_k");
      if (r.layers < 1 || r.layers > 1024 || r.canvas_length < 1 || r.canvas_length > 65536) {
        corrupt(file + ": /spec has an absurd layer count or canvas length");
      }
      r.prompt_ids = rd.vec<std::int64_t>(spec, "/spec", "prompt_ids");

      const H5::Group runs = f.openGroup("runs");
      for (const auto& id :
           json_list(rd.str(runs, "/runs", "order_json"), file + ": /runs/@order_json")) {
        r.runs.push_back(read_run(rd, runs, id, r.canvas_length));
      }
      const H5::Group comps = f.openGroup("comparisons");
      for (const auto& id : json_list(rd.str(comps, "/comparisons", "order_json"),
                                      file + ": /comparisons/@order_json")) {
        r.comparisons.push_back(read_comparison(rd, comps, id, r));
      }
      return r;
    } catch (const H5::Exception& e) {
      corrupt(file + ": damaged HDF5 data (" + e.getDetailMsg() + ")");
    }
  });
}

}  // namespace batchlens::io
