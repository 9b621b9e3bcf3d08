// SPDX-License-Identifier: Apache-2.0
#include "core/io/experiment_file.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>

#include <H5Cpp.h>
#include <nlohmann/json.hpp>

#include "core/base/atomic_file.h"
#include "core/base/input.h"

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

constexpr std::int64_t kMaxElements = std::int64_t{1} << 31;  // per dataset
// Most bytes one file's arrays may take in memory (docs/reliability.md); a file may claim less
// still: at most ~1100 times its size on disk.
constexpr std::uint64_t kMaxReadBytes = std::uint64_t{16} << 30U;

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

// ---- checksums ----------------------------------------------------------------------------

// HDF5's Fletcher-32 (H5_checksum_fletcher32 in H5checksum.c): 16-bit big-endian words summed in
// blocks of 360, an odd last byte as the high half of a word. The fletcher32 filter appends it,
// little-endian, after the chunk's other filters' output.
std::uint32_t fletcher32(const unsigned char* data, std::size_t bytes) {
  std::size_t words = bytes / 2;
  std::uint32_t sum1 = 0;
  std::uint32_t sum2 = 0;
  while (words > 0) {
    std::size_t block = std::min<std::size_t>(words, 360);
    words -= block;
    for (; block > 0; --block) {
      sum1 += (static_cast<std::uint32_t>(data[0]) << 8U) | data[1];
      data += 2;
      sum2 += sum1;
    }
    sum1 = (sum1 & 0xffffU) + (sum1 >> 16U);
    sum2 = (sum2 & 0xffffU) + (sum2 >> 16U);
  }
  if (bytes % 2 != 0) {
    sum1 += static_cast<std::uint32_t>(*data) << 8U;
    sum2 += sum1;
    sum1 = (sum1 & 0xffffU) + (sum1 >> 16U);
    sum2 = (sum2 & 0xffffU) + (sum2 >> 16U);
  }
  sum1 = (sum1 & 0xffffU) + (sum1 >> 16U);
  sum2 = (sum2 & 0xffffU) + (sum2 >> 16U);
  return (sum2 << 16U) | sum1;
}

// HDF5's metadata checksum (H5_checksum_lookup3 in H5checksum.c: Bob Jenkins' lookup3
// hashlittle, byte by byte), for the superblock fix below.
std::uint32_t rot(std::uint32_t x, unsigned k) {
  return (x << k) ^ (x >> (32U - k));
}

std::uint32_t lookup3(const unsigned char* k, std::size_t length, std::uint32_t initval) {
  std::uint32_t a = 0xdeadbeefU + static_cast<std::uint32_t>(length) + initval;
  std::uint32_t b = a;
  std::uint32_t c = a;
  const auto word = [](const unsigned char* p) {
    return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8U) |
           (static_cast<std::uint32_t>(p[2]) << 16U) | (static_cast<std::uint32_t>(p[3]) << 24U);
  };
  while (length > 12) {
    a += word(k);
    b += word(k + 4);
    c += word(k + 8);
    a -= c;
    a ^= rot(c, 4);
    c += b;  // NOLINT(readability-isolate-declaration)
    b -= a;
    b ^= rot(a, 6);
    a += c;
    c -= b;
    c ^= rot(b, 8);
    b += a;
    a -= c;
    a ^= rot(c, 16);
    c += b;
    b -= a;
    b ^= rot(a, 19);
    a += c;
    c -= b;
    c ^= rot(b, 4);
    b += a;
    length -= 12;
    k += 12;
  }
  if (length == 0) {
    return c;
  }
  std::array<unsigned char, 12> tail{};
  std::memcpy(tail.data(), k, length);
  a += word(tail.data());
  b += word(tail.data() + 4);
  c += word(tail.data() + 8);
  c ^= b;
  c -= rot(b, 14);
  a ^= c;
  a -= rot(c, 11);
  b ^= a;
  b -= rot(a, 25);
  c ^= b;
  c -= rot(b, 16);
  a ^= c;
  a -= rot(c, 4);
  b ^= a;
  b -= rot(a, 14);
  c ^= b;
  c -= rot(b, 24);
  return c;
}

// H5Fget_file_image of HDF5 1.10 clears the superblock's status flags in the image (the file is
// open for writing when the image is taken) without updating the superblock's checksum, so the
// image would not open. Superblocks of version 2 and 3 end with a lookup3 checksum of the bytes
// before it: 12 fixed bytes and four addresses.
void fix_superblock_checksum(std::vector<char>& image) {
  auto* b = reinterpret_cast<unsigned char*>(image.data());
  if (image.size() < 12 || std::memcmp(b, "\x89HDF\r\n\x1a\n", 8) != 0 || b[8] < 2) {
    return;
  }
  const std::size_t n = 12 + 4 * std::size_t{b[9]};
  if (image.size() < n + 4) {
    return;
  }
  const std::uint32_t sum = lookup3(b, n, 0);
  for (unsigned k = 0; k < 4; ++k) {
    b[n + k] = static_cast<unsigned char>(sum >> (8U * k));
  }
}

void append_fletcher32(std::vector<unsigned char>& chunk) {
  const std::uint32_t sum = fletcher32(chunk.data(), chunk.size());
  for (unsigned k = 0; k < 4; ++k) {
    chunk.push_back(static_cast<unsigned char>(sum >> (8U * k)));
  }
}

// A group's attributes, digested (schema 1.2): the sum of crc32(name, tag, value bytes) over the
// group's attributes, stored as `attrs_crc32`, so that the digest does not depend on the order
// attributes are written or read. HDF5's own v2 object headers are checksummed as well; this
// also covers attributes kept in dense storage.
class AttrDigest {
 public:
  void add(const std::string& name, char tag, const void* data, std::size_t size) {
    uLong c = crc32(0L, Z_NULL, 0);
    c = crc32(c, reinterpret_cast<const Bytef*>(name.data()), static_cast<uInt>(name.size()));
    c = crc32(c, reinterpret_cast<const Bytef*>(&tag), 1);
    // Values over 4 GiB cannot occur (attributes are bounded on read); feed in pieces anyway.
    const auto* p = static_cast<const Bytef*>(data);
    while (size > 0) {
      const auto n = static_cast<uInt>(std::min<std::size_t>(size, 1U << 30U));
      c = crc32(c, p, n);
      p += n;
      size -= n;
    }
    sum_ += static_cast<std::uint32_t>(c);
  }
  std::uint32_t value() const { return sum_; }

 private:
  std::uint32_t sum_ = 0;
};

constexpr const char* kDigestAttr = "attrs_crc32";

// ---- writing ------------------------------------------------------------------------------

// What HDF5 said when its last call failed: recorded by HDF5's error callback at the moment of
// the failure (any later HDF5 call, e.g. a destructor's close, clears the error stack). The
// system's reason, e.g. "errno = 28, error message = 'No space left on device'", is preferred.
std::string& last_hdf5_error() {
  static std::string text;  // HDF5 calls are serialised by hdf5_mutex()
  return text;
}

herr_t record_hdf5_error(hid_t stack, void* /*data*/) {
  std::vector<std::string> lines;
  H5Ewalk2(
      stack, H5E_WALK_DOWNWARD,
      [](unsigned /*n*/, const H5E_error2_t* e, void* out) -> herr_t {
        auto& v = *static_cast<std::vector<std::string>*>(out);
        if (e->desc != nullptr && v.size() < 32) {
          v.emplace_back(std::string(e->func_name != nullptr ? e->func_name : "") + ": " + e->desc);
        }
        return 0;
      },
      &lines);
  std::string text = lines.empty() ? std::string() : lines.back();  // the innermost
  for (const auto& l : lines) {
    if (l.find("errno") != std::string::npos) {
      text = l;
    }
  }
  last_hdf5_error() = text;
  return 0;
}

// Routes HDF5's errors to record_hdf5_error, never to stderr. Call with hdf5_mutex() held.
void quiet_hdf5() {
  H5::Exception::dontPrint();
  H5PLset_loading_state(0);  // files never make this process load filter plugins
  H5Eset_auto2(H5E_DEFAULT, record_hdf5_error, nullptr);
  last_hdf5_error().clear();
}

std::string hdf5_error_text() {
  return last_hdf5_error().empty() ? std::string("no reason given") : last_hdf5_error();
}

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

// ---- chunked, compressed arrays -----------------------------------------------------------

constexpr std::int64_t kMinChunkedElements = 4096;  // smaller arrays: one chunk, checksum only
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

// What HDF5's filter pipeline makes of one chunk with shuffle + deflate + fletcher32, so that any
// reader decodes it as before: the chunk padded with zeros to `chunk_elements` (what HDF5 does to
// edge chunks), shuffled as H5Z_filter_shuffle does (byte i of element j goes to i * N + j) and
// compressed as H5Z_filter_deflate does (zlib's compress2, a zlib stream with its header), then
// its Fletcher-32 appended as H5Z_filter_fletcher32 does.
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
  append_fletcher32(out);
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
    if (n == 0) {
      g.createDataSet(name, h5type<T>(), space, plist);  // no data, nothing to checksum
      return;
    }
    if (n < kMinChunkedElements) {
      // One chunk holding the whole array, Fletcher-32 only (schema 1.2; was contiguous).
      plist.setChunk(static_cast<int>(dims.size()), dims.data());
      plist.setFletcher32();
      H5::DataSet ds = g.createDataSet(name, h5type<T>(), space, plist);
      ds.write(data, h5type<T>());
      return;
    }
    // Shuffle + gzip (the arrays are mostly zeros) + Fletcher-32.
    const ChunkGrid grid = chunk_grid(dims);
    plist.setChunk(static_cast<int>(grid.chunk.size()), grid.chunk.data());
    plist.setShuffle();
    plist.setDeflate(kDeflateLevel);
    plist.setFletcher32();
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
                                               " of " + ds.getObjName() + " (" + hdf5_error_text() +
                                               ")");
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
  GroupWriter gw(runs.createGroup(r.id));
  gw.i64("batch_size", r.batch_size);
  gw.str("group", r.group);
  gw.str("policy_json", r.policy_json);
  gw.str("policy_text", r.policy_text);
  gw.i64("emulated", r.emulated ? 1 : 0);
  gw.f64("wall_time_s", r.wall_time_s);
  gw.i64("stop_position", r.stop_position);
  gw.str("text", r.text);
  gw.seal();
  H5::Group& g = gw.group();
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
  GroupWriter gw(comps.createGroup(c.id));
  gw.str("reference", c.reference);
  gw.str("run", c.run);
  gw.str("kind", c.kind);
  gw.i64("tokens_identical", c.tokens_identical ? 1 : 0);
  gw.i64("tokens_changed", c.tokens_changed);
  gw.i64("stop_changed", c.stop_changed ? 1 : 0);
  gw.i64("steps_changed", c.steps_changed ? 1 : 0);
  gw.i64("first_tick", c.first.tick);
  gw.i64("first_canvas", c.first.canvas);
  gw.i64("first_step", c.first.step);
  gw.i64("first_layer", c.first.layer);
  gw.str("first_tap", c.first.tap);
  gw.i64("first_position", c.first.position);
  gw.seal();
  H5::Group& g = gw.group();
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

// Checks what an HDF5 C call returned; a failure names `what` and HDF5's (system) reason.
void h5check(herr_t status, const std::string& what) {
  if (status < 0) {
    base::raise(ErrorCode::IoFailed, what + ": " + hdf5_error_text());
  }
}

// The whole file, built in memory (HDF5's core driver, no backing store) and returned as its
// byte image; the caller writes the image through a base::AtomicFile. HDF5 never touches the
// disk, so a full disk, a quota or an I/O error shows in one checked write of ours (errno named)
// and never in an HDF5 close: HDF5 1.10.8 keeps a file whose close failed half closed and
// crashes when it is closed again, at exit at the latest. Every object is closed before the file
// (H5F_CLOSE_SEMI refuses to close a file with open objects); each call's return is checked.
std::vector<char> build_image(const std::string& name, const ExperimentResult& r) {
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  // Newest file-format objects of HDF5 1.10: superblock v3, v2 object headers, chunk indexes and
  // heaps with checksums, so that damaged metadata is detected instead of followed.
  const bool props = fapl >= 0 &&
                     H5Pset_fapl_core(fapl, std::size_t{16} << 20U, /*backing_store=*/false) >= 0 &&
                     H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110) >= 0 &&
                     H5Pset_fclose_degree(fapl, H5F_CLOSE_SEMI) >= 0;
  const hid_t fid = props ? H5Fcreate(name.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl) : -1;
  if (fapl >= 0) {
    H5Pclose(fapl);
  }
  if (fid < 0) {
    base::raise(ErrorCode::IoFailed, "cannot create the file in memory: " + hdf5_error_text());
  }
  struct Close {  // on an error; in memory a close has nothing that can fail
    hid_t id;
    bool done = false;
    Close(const Close&) = delete;
    Close& operator=(const Close&) = delete;
    Close(Close&&) = delete;
    Close& operator=(Close&&) = delete;
    ~Close() {
      if (!done) {
        H5Fclose(id);
      }
    }
  } guard{fid};
  {
    const auto group = [&](const char* name) {
      return GroupWriter(adopt_group(H5Gcreate2(fid, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                                     std::string("/") + name));
    };
    ArrayWriter arrays;
    GroupWriter root(adopt_group(H5Gopen2(fid, "/", H5P_DEFAULT), "/"));
    root.str("format", kFormat);
    root.i64("schema_major", kSchemaMajor);
    root.i64("schema_minor", kSchemaMinor);
    root.str("tool_version", r.provenance.tool_version);
    root.str("created_utc", r.provenance.created_utc);
    root.seal();

    GroupWriter prov = group("provenance");
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
      prov.str(k, v);
    }
    prov.i64("threads", p.threads);
    prov.i64("emulated", p.emulated ? 1 : 0);
    prov.seal();

    GroupWriter spec = group("spec");
    spec.str("spec_json", base::dump_json_lossy(experiment::to_json(r.spec)));
    spec.str("config_json", r.config_json);
    spec.str("generation_config_json", r.generation_config_json);
    spec.str("prompt_text", r.prompt_text);
    spec.str("taps_json", base::dump_json_lossy(nlohmann::json(r.taps)));
    spec.i64("layers", r.layers);
    spec.i64("canvas_length", r.canvas_length);
    spec.i64("top_k", r.top_k);
    spec.seal();
    write_vec(arrays, spec.group(), "prompt_ids", r.prompt_ids);

    GroupWriter runs = group("runs");
    nlohmann::json run_ids = nlohmann::json::array();
    for (const auto& run : r.runs) {
      write_run(arrays, runs.group(), run);
      run_ids.push_back(run.id);
    }
    runs.str("order_json", base::dump_json_lossy(run_ids));
    runs.seal();
    GroupWriter comps = group("comparisons");
    nlohmann::json comp_ids = nlohmann::json::array();
    for (const auto& c : r.comparisons) {
      write_comparison(arrays, comps.group(), c);
      comp_ids.push_back(c.id);
    }
    comps.str("order_json", base::dump_json_lossy(comp_ids));
    comps.seal();
  }  // every group, dataset and attribute closed here
  h5check(H5Fflush(fid, H5F_SCOPE_GLOBAL), "cannot flush the file");
  const ssize_t size = H5Fget_file_image(fid, nullptr, 0);
  if (size <= 0) {
    base::raise(ErrorCode::IoFailed, "cannot size the file image: " + hdf5_error_text());
  }
  std::vector<char> image(static_cast<std::size_t>(size));
  if (H5Fget_file_image(fid, image.data(), image.size()) != size) {
    base::raise(ErrorCode::IoFailed, "cannot copy the file image: " + hdf5_error_text());
  }
  guard.done = true;
  h5check(H5Fclose(fid), "cannot close the file");
  fix_superblock_checksum(image);
  return image;
}

// Test hook (docs/reliability.md): BATCHLENS_TEST_WRITE_PAUSE_MS=N sleeps N ms after the
// temporary file exists, so tests can deliver signals while a write is in flight.
void test_pause() {
  const char* env = std::getenv("BATCHLENS_TEST_WRITE_PAUSE_MS");  // NOLINT(concurrency-mt-unsafe)
  if (env != nullptr) {
    const long ms = std::strtol(env, nullptr, 10);
    if (ms > 0 && ms < 600000) {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    }
  }
}

// ---- reading ------------------------------------------------------------------------------
// Every attribute and dataset is checked for class, rank, shape and element type before it is
// read, into storage sized from the checked shape, within a byte budget set from the file's size
// (a deflated chunk expands at most ~1032 times) and kMaxReadBytes.

bool exists(hid_t g, const std::string& name) {
  return H5Lexists(g, name.c_str(), H5P_DEFAULT) > 0;
}

// Owns an HDF5 id of any kind.
class Hid {
 public:
  explicit Hid(hid_t id) : id_(id) {}
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  Hid(Hid&&) = delete;
  Hid& operator=(Hid&&) = delete;
  ~Hid() {
    if (id_ >= 0) {
      H5Idec_ref(id_);
    }
  }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
};

class Reader {
 public:
  Reader(std::string file, std::uint64_t file_bytes)
      : file_(std::move(file)),
        file_bytes_(file_bytes),
        budget_(std::min<std::uint64_t>(kMaxReadBytes, file_bytes * kMaxExpansion + (1U << 20U))) {}

  const std::string& file() const { return file_; }
  void set_schema(std::int64_t major, std::int64_t minor) {
    sealed_ = major > 1 || (major == 1 && minor >= 2);
  }
  bool sealed() const { return sealed_; }

  [[noreturn]] void fail(const std::string& what) const { corrupt(file_ + ": " + what); }

  // A group whose attributes are read through it, then checked against its digest.
  class Group {
   public:
    Group(const Reader& rd, hid_t g, std::string where)
        : rd_(rd), g_(g), where_(std::move(where)) {}
    hid_t id() const { return g_.get(); }
    const std::string& where() const { return where_; }

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
        const std::size_t size = H5Tget_size(type.get());
        if (size == 0 || size > rd_.file_bytes_) {
          rd_.fail(at(name) + " claims " + std::to_string(size) + " bytes");
        }
        const Hid mem(H5Tcopy(H5T_C_S1));
        std::vector<char> buf(size);
        if (!mem.ok() || H5Tset_size(mem.get(), size) < 0 ||
            H5Tset_strpad(mem.get(), H5Tget_strpad(type.get())) < 0 ||
            H5Aread(a.get(), mem.get(), buf.data()) < 0) {
          rd_.fail(at(name) + " cannot be read (" + hdf5_error_text() + ")");
        }
        std::size_t n = size;
        if (H5Tget_strpad(type.get()) == H5T_STR_NULLTERM) {
          n = buf[size - 1] == '\0' ? size - 1 : size;  // our writer: bytes + one NUL
        } else {
          while (n > 0 && buf[n - 1] == '\0') {
            --n;
          }
        }
        v.assign(buf.data(), n);
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
    std::string at(const std::string& name) const { return where_ + "/@" + name; }

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

  /// Soft and external links are refused: a file must not make the reader open other files or
  /// follow paths of its choosing.
  void check_hard_link(hid_t parent, const std::string& name, const std::string& at) const {
    H5L_info_t info{};
    if (H5Lget_info(parent, name.c_str(), &info, H5P_DEFAULT) < 0 || info.type != H5L_TYPE_HARD) {
      fail(at + " is a link, not an object of this file");
    }
  }

  /// Only the layouts and filters BatchLens writes: no external raw-data files, no virtual
  /// datasets (both read other files), no filter that would load a plugin.
  void check_storage(hid_t ds, const std::string& at) const {
    const Hid dcpl(H5Dget_create_plist(ds));
    const H5D_layout_t layout = dcpl.ok() ? H5Pget_layout(dcpl.get()) : H5D_LAYOUT_ERROR;
    if (layout != H5D_COMPACT && layout != H5D_CONTIGUOUS && layout != H5D_CHUNKED) {
      fail(at + " has a storage layout BatchLens does not write");
    }
    if (H5Pget_external_count(dcpl.get()) != 0) {
      fail(at + " keeps its data in external files");
    }
    const int filters = H5Pget_nfilters(dcpl.get());
    for (int i = 0; i < filters; ++i) {
      unsigned flags = 0;
      std::size_t n = 0;
      unsigned config = 0;
      const H5Z_filter_t id = H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags, &n,
                                             nullptr, 0, nullptr, &config);
      if (id != H5Z_FILTER_SHUFFLE && id != H5Z_FILTER_DEFLATE && id != H5Z_FILTER_FLETCHER32) {
        fail(at + " uses HDF5 filter " + std::to_string(id) + ", which BatchLens does not write");
      }
    }
  }

  /// Opens a group that must exist.
  Group group(const Group& parent, const std::string& name) const {
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

  /// A dataset of element type T and the expected shape (-1: any extent), checked before it is
  /// read into storage sized from the checked shape.
  template <class T>
  NdArray<T> nd(const Group& g, const std::string& name, const std::vector<std::int64_t>& expect) {
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
    const Hid space(H5Dget_space(ds.get()));
    const int rank = space.ok() ? H5Sget_simple_extent_ndims(space.get()) : -1;
    if (rank != static_cast<int>(expect.size())) {
      fail(at + " has " + std::to_string(rank) + " dimensions, expected " +
           std::to_string(expect.size()));
    }
    std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    NdArray<T> out;
    std::uint64_t n = 1;
    for (std::size_t k = 0; k < dims.size(); ++k) {
      if (expect[k] >= 0 && dims[k] != static_cast<hsize_t>(expect[k])) {
        fail(at + " dimension " + std::to_string(k) + " is " + std::to_string(dims[k]) +
             ", expected " + std::to_string(expect[k]));
      }
      if (dims[k] > static_cast<hsize_t>(kMaxElements)) {
        fail(at + " claims an absurd size");
      }
      n *= dims[k];
      if (n > static_cast<std::uint64_t>(kMaxElements)) {
        fail(at + " claims an absurd size");
      }
      out.shape.push_back(static_cast<std::int64_t>(dims[k]));
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
    if (n > 0 && H5Dread(ds.get(), h5type<T>().getId(), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                         out.data.data()) < 0) {
      fail(at + " is damaged (" + hdf5_error_text() + ")");
    }
    return out;
  }

  template <class T, class V = T>
  std::vector<V> vec(const Group& g, const std::string& name, std::int64_t expect = -1) {
    const NdArray<T> a = nd<T>(g, name, {expect});
    return std::vector<V>(a.data.begin(), a.data.end());
  }

 private:
  // Deflate expands at most ~1032:1; shuffle and Fletcher-32 add nothing.
  static constexpr std::uint64_t kMaxExpansion = 1100;

  std::string file_;
  std::uint64_t file_bytes_;
  std::uint64_t budget_;
  bool sealed_ = false;
};

RunResult read_run(Reader& rd, const Reader::Group& runs, const std::string& id, std::int64_t c) {
  Reader::Group g = rd.group(runs, id);
  RunResult r;
  r.id = id;
  r.batch_size = g.i64("batch_size");
  r.group = g.str("group");
  r.policy_json = g.str("policy_json");
  r.policy_text = g.str("policy_text");
  r.emulated = g.i64("emulated") != 0;
  r.wall_time_s = g.f64("wall_time_s");
  r.stop_position = g.i64("stop_position");
  r.text = g.str("text");
  g.check_digest();
  r.tick_canvas = rd.vec<std::int32_t, int>(g, "tick_canvas");
  const auto s = static_cast<std::int64_t>(r.tick_canvas.size());
  r.tick_step = rd.vec<std::int32_t, int>(g, "tick_step", s);
  r.canvas_in = rd.nd<std::int64_t>(g, "canvas_in", {s, c});
  r.argmax = rd.nd<std::int64_t>(g, "argmax", {s, c});
  r.sampled = rd.nd<std::int64_t>(g, "sampled", {s, c});
  r.accepted = rd.nd<std::uint8_t>(g, "accepted", {s, c});
  r.entropy = rd.nd<float>(g, "entropy", {s, c});
  r.tokens = rd.vec<std::int64_t>(g, "tokens");
  r.steps = rd.vec<std::int32_t, int>(g, "steps");
  return r;
}

ComparisonResult read_comparison(Reader& rd, const Reader::Group& comps, const std::string& id,
                                 const ExperimentResult& res) {
  Reader::Group g = rd.group(comps, id);
  ComparisonResult c;
  c.id = id;
  c.reference = g.str("reference");
  c.run = g.str("run");
  c.kind = g.str("kind");
  c.tokens_identical = g.i64("tokens_identical") != 0;
  c.tokens_changed = g.i64("tokens_changed");
  c.stop_changed = g.i64("stop_changed") != 0;
  c.steps_changed = g.i64("steps_changed") != 0;
  const auto int_field = [&](const char* name) {
    const std::int64_t v = g.i64(name);
    if (v < -1 || v > std::numeric_limits<int>::max()) {
      rd.fail(g.where() + "/@" + name + " is out of range (" + std::to_string(v) + ")");
    }
    return static_cast<int>(v);
  };
  c.first.tick = int_field("first_tick");
  c.first.canvas = int_field("first_canvas");
  c.first.step = int_field("first_step");
  c.first.layer = int_field("first_layer");
  c.first.tap = g.str("first_tap");
  c.first.position = g.i64("first_position");
  g.check_digest();
  if (c.kind != "row0" && c.kind != "rows") {
    rd.fail(g.where() + " has the unknown kind '" + c.kind + "'");
  }
  const RunResult* ref = res.run(c.reference);
  if (ref == nullptr || res.run(c.run) == nullptr) {
    rd.fail(g.where() + " names a run that is not in /runs");
  }
  const auto s = static_cast<std::int64_t>(ref->tick_canvas.size());
  const std::int64_t slots = res.layers + 1;
  const auto t = static_cast<std::int64_t>(res.taps.size());
  c.frac_differ = rd.nd<float>(g, "frac_differ", {s, slots, t});
  c.max_abs = rd.nd<float>(g, "max_abs", {s, slots, t});
  c.max_ulp = rd.nd<float>(g, "max_ulp", {s, slots, t});
  c.compared = rd.vec<std::uint8_t>(g, "compared", s);
  if (c.kind == "row0") {
    c.pos_frac_differ = rd.nd<float>(g, "pos_frac_differ", {s, slots, t, res.canvas_length});
    if (rd.sealed() || exists(g.id(), "pos_max_abs")) {  // schema 1.1
      c.pos_max_abs = rd.nd<float>(g, "pos_max_abs", {s, slots, t, res.canvas_length});
      c.pos_max_ulp = rd.nd<float>(g, "pos_max_ulp", {s, slots, t, res.canvas_length});
    }
    c.routing_flips = rd.nd<std::uint8_t>(g, "routing_flips", {s, res.layers, res.canvas_length});
    c.router_margin = rd.nd<float>(g, "router_margin", {s, res.layers, res.canvas_length});
    c.sampler_diff = rd.nd<std::uint8_t>(g, "sampler_diff", {s, res.canvas_length});
    const NdArray<std::int64_t> edits = rd.nd<std::int64_t>(g, "token_diff", {-1, 3});
    for (std::int64_t i = 0; i < edits.shape[0]; ++i) {
      const std::int64_t op = edits.at({i, 0});
      if (op < 0 || op > 3) {
        rd.fail(g.where() + "/token_diff has an unknown edit " + std::to_string(op));
      }
      c.token_diff.push_back(
          {static_cast<text::TokenEdit::Op>(op), edits.at({i, 1}), edits.at({i, 2})});
    }
  }
  return c;
}

std::vector<std::string> json_list(const std::string& text, const std::string& what) {
  auto parsed = base::parse_json(text, what, ErrorCode::FileCorrupted);
  if (!parsed.ok()) {
    base::raise(ErrorCode::FileCorrupted, parsed.error().message);
  }
  const nlohmann::json& j = parsed.value();
  if (!j.is_array()) {
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

// Raises `code` with `prefix` + what: the reader's FileCorrupted naming the file, the writer's
// InvalidArgument before it writes anything.
struct Fail {
  std::string prefix;
  ErrorCode code;
  [[noreturn]] void operator()(const std::string& what) const { base::raise(code, prefix + what); }
};

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

void check_unique(const Fail& fail, std::vector<std::string> ids, const std::string& what) {
  std::sort(ids.begin(), ids.end());
  const auto dup = std::adjacent_find(ids.begin(), ids.end());
  if (dup != ids.end()) {
    fail(what + " lists '" + *dup + "' twice");
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
    if (cmp.kind == "row0" && cmp.reference == cmp.run) {
      fail(at + " compares run '" + cmp.run + "' with itself");
    }
    if (cmp.kind == "rows" && (cmp.reference != cmp.run || run->batch_size < 2)) {
      fail(at + " compares the rows of a batch but names two runs or a run of batch size 1");
    }
    if (cmp.kind != "row0" && cmp.kind != "rows") {
      fail(at + "/@kind is neither row0 nor rows");
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
    corrupt(file + ": HDF5 cannot open it (truncated or damaged: " + hdf5_error_text() + ")");
  }
  Reader::Group root(rd, H5Gopen2(f.get(), "/", H5P_DEFAULT), "/");
  if (H5Aexists(root.id(), "format") <= 0) {
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
  ExperimentResult r;
  auto& p = r.provenance;
  p.tool_version = root.str("tool_version");
  p.created_utc = root.str("created_utc");
  root.check_digest();
  for (const char* g : {"provenance", "spec", "runs", "comparisons"}) {
    if (!exists(root.id(), g)) {
      corrupt(file + ": missing group /" + std::string(g));
    }
  }
  {
    Reader::Group prov = rd.group(root, "provenance");
    p.host = prov.str("host");
    p.device = prov.str("device");
    p.device_name = prov.str("device_name");
    p.driver = prov.str("driver");
    p.cuda = prov.str("cuda");
    p.cublas = prov.str("cublas");
    p.libtorch = prov.str("libtorch");
    p.blas = prov.str("blas");
    p.dtype = prov.str("dtype");
    p.threads = prov.i64("threads");
    p.emulated = prov.i64("emulated") != 0;
    prov.check_digest();
  }
  {
    Reader::Group spec = rd.group(root, "spec");
    const std::string spec_text = spec.str("spec_json");
    r.config_json = spec.str("config_json");
    r.generation_config_json = spec.str("generation_config_json");
    r.prompt_text = spec.str("prompt_text");
    const std::string taps = spec.str("taps_json");
    const std::int64_t layers = spec.i64("layers");
    r.canvas_length = spec.i64("canvas_length");
    r.top_k = spec.i64("top_k");
    spec.check_digest();
    const auto spec_doc = base::parse_json(spec_text, "/spec/@spec_json", ErrorCode::FileCorrupted);
    if (!spec_doc.ok()) {
      corrupt(file + ": " + spec_doc.error().message);
    }
    auto parsed = experiment::spec_from_json(spec_doc.value());
    if (!parsed.ok()) {
      corrupt(file + ": " + parsed.error().message);
    }
    r.spec = parsed.value();
    r.taps = json_list(taps, file + ": /spec/@taps_json");
    if (layers < 1 || layers > 1024 || r.canvas_length < 1 || r.canvas_length > 65536) {
      corrupt(file + ": /spec has an absurd layer count or canvas length");
    }
    r.layers = static_cast<int>(layers);
    r.prompt_ids = rd.vec<std::int64_t>(spec, "prompt_ids");
  }
  {
    Reader::Group runs = rd.group(root, "runs");
    const std::string order = runs.str("order_json");
    runs.check_digest();
    const auto ids = json_list(order, file + ": /runs/@order_json");
    check_unique(Fail{file + ": ", ErrorCode::FileCorrupted}, ids, "/runs/@order_json");
    for (const auto& id : ids) {
      r.runs.push_back(read_run(rd, runs, id, r.canvas_length));
    }
  }
  {
    Reader::Group comps = rd.group(root, "comparisons");
    const std::string order = comps.str("order_json");
    comps.check_digest();
    const auto ids = json_list(order, file + ": /comparisons/@order_json");
    check_unique(Fail{file + ": ", ErrorCode::FileCorrupted}, ids, "/comparisons/@order_json");
    for (const auto& id : ids) {
      r.comparisons.push_back(read_comparison(rd, comps, id, r));
    }
  }
  validate(Fail{file + ": ", ErrorCode::FileCorrupted}, r);
  return r;
}

}  // namespace

base::Result<void> write_experiment(const fs::path& path, const ExperimentResult& r) {
  auto result = base::guarded([&] {
    // What the reader would refuse is refused before anything is written.
    validate(Fail{"the result is inconsistent: ", ErrorCode::InvalidArgument}, r);
    base::AtomicFile out(path);
    std::vector<char> image;
    {
      const std::lock_guard<std::mutex> lock(hdf5_mutex());
      quiet_hdf5();
      try {
        image = build_image(out.temp_path().string(), r);
      } catch (const H5::Exception& e) {
        base::raise(ErrorCode::IoFailed,
                    "HDF5: " + e.getDetailMsg() + " (" + hdf5_error_text() + ")");
      }
    }
    test_pause();
    out.write(image.data(), image.size());
    image = {};
    // Verified before it replaces anything: the file reads back whole, checksums included.
    auto back = read_experiment(out.temp_path());
    if (!back.ok()) {
      base::raise(ErrorCode::IoFailed,
                  "the written file does not read back: " + back.error().message);
    }
    out.commit();
  });
  if (!result.ok()) {
    return base::Error{
        result.error().code == ErrorCode::Internal ? ErrorCode::IoFailed : result.error().code,
        "cannot write " + path.string() + ": " + result.error().message};
  }
  return result;
}

base::Result<ExperimentResult> read_experiment(const fs::path& path) {
  auto size = base::check_input_file(path, "experiment file");
  if (!size.ok()) {
    return size.error();
  }
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
    quiet_hdf5();
    const std::string file = path.string();
    try {
      return read_file(file, size.value());
    } catch (const H5::Exception& e) {
      corrupt(file + ": damaged HDF5 data (" + e.getDetailMsg() + ")");
    }
  });
}

}  // namespace batchlens::io
