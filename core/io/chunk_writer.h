// SPDX-License-Identifier: Apache-2.0
// The experiment file's array writer: chunked datasets whose chunks are shuffled, deflated and
// checksummed on a pool of threads exactly as HDF5's own filter pipeline would, then stored with
// H5Dwrite_chunk (docs/file-format.md, "Arrays of 4096 elements or more"). Internal to core/io.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <H5Cpp.h>

#include "core/io/hdf5_util.h"

namespace batchlens::io {

/// Runs job(index, worker) for every index in [0, n) on the calling thread (worker 0) and up to
/// max_threads - 1 helper threads (workers 1...), started when first needed and joined by the
/// destructor. job may throw: the first exception stops the hand-out of indices and is rethrown
/// by run() on the calling thread once every helper is idle again; nothing crosses a thread
/// boundary unhandled. run() is called from one thread at a time.
class WorkPool {
 public:
  using Job = std::function<void(std::size_t index, std::size_t worker)>;

  explicit WorkPool(std::size_t max_threads);
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;
  WorkPool(WorkPool&&) = delete;
  WorkPool& operator=(WorkPool&&) = delete;
  ~WorkPool();

  std::size_t max_threads() const { return max_threads_; }

  /// Returns when every index ran or one job threw (then rethrows its exception).
  void run(std::size_t n, const Job& job);

 private:
  void work(std::size_t worker);
  void helper_loop(std::size_t worker);

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

/// HDF5's Fletcher-32 (H5_checksum_fletcher32 in H5checksum.c): 16-bit big-endian words summed in
/// blocks of 360, an odd last byte as the high half of a word.
std::uint32_t fletcher32(const unsigned char* data, std::size_t bytes);

/// Appends the chunk's Fletcher-32, little-endian, as HDF5's fletcher32 filter does after the
/// chunk's other filters' output.
void append_fletcher32(std::vector<unsigned char>& chunk);

/// Which chunks a filtered dataset is cut into. One tick (first dimension) per chunk; then
/// leading dimensions set to 1 until a chunk holds at most 1M elements; a last dimension that
/// alone is longer is cut to 1M elements (it used to be cut to 1: a 1-D array of 2M elements got
/// 2M chunks of one element). So the chunk is [1, ..., 1, c, dims[split+1], ...]: each chunk is
/// one contiguous row-major run of the array, and only dimension `split` has a partial edge chunk.
struct ChunkGrid {
  std::vector<hsize_t> dims;
  std::vector<hsize_t> chunk;
  std::size_t split = 0;  ///< the one dimension where chunk and dims may differ besides 1s
  hsize_t rows = 1;       ///< product of dims[0, split)
  hsize_t per_row = 1;    ///< chunks along dims[split]
  hsize_t inner = 1;      ///< product of dims(split, rank)

  hsize_t chunk_elements() const { return chunk[split] * inner; }
  hsize_t count() const { return rows * per_row; }
  /// Chunk t in HDF5's (row-major) chunk order: its first element and how many it holds.
  std::pair<hsize_t, hsize_t> span(hsize_t t) const;
  /// Chunk t's offset in elements, what H5Dwrite_chunk takes.
  void offset(hsize_t t, std::vector<hsize_t>& out) const;
};

/// The chunk grid of an array of shape `dims` (rank >= 1).
ChunkGrid chunk_grid(const std::vector<hsize_t>& dims);

/// Per-thread buffers for one chunk, reused from chunk to chunk.
struct ChunkScratch {
  std::vector<unsigned char> shuffled;
  std::vector<unsigned char> packed;
};

/// What HDF5's filter pipeline makes of one chunk with shuffle + deflate + fletcher32, so that
/// any reader decodes it as before: the chunk's `elements` elements of `size` bytes at `src`,
/// padded with zeros to `chunk_elements` (what HDF5 does to edge chunks), shuffled as
/// H5Z_filter_shuffle does (byte i of element j goes to i * N + j) and compressed as
/// H5Z_filter_deflate does (zlib's compress2 at level 4, a zlib stream with its header), then
/// its Fletcher-32 appended as H5Z_filter_fletcher32 does; into `out`. Thread-safe for distinct
/// scratch and out. Throws IoFailed when zlib fails.
void shuffle_deflate(const unsigned char* src, std::size_t elements, std::size_t size,
                     std::size_t chunk_elements, ChunkScratch& scratch,
                     std::vector<unsigned char>& out);

/// Writes a file's arrays. An empty array is a dataset without data. Arrays under 4096 elements
/// are one chunk with the Fletcher-32 filter. Larger ones are chunked (chunk_grid) with shuffle +
/// deflate 4 + Fletcher-32; their chunks are shuffled and compressed on a WorkPool of up to 16
/// threads and written one after another with H5Dwrite_chunk by the calling thread (which holds
/// hdf5_mutex(): the helpers never call HDF5), at most about 64 MiB of raw data per batch.
/// `serial` writes them through HDF5's own filter pipeline on one thread instead (the same bytes,
/// slower; kept to compare against: WriteOptions::serial).
/// One ArrayWriter per file write; its helpers are joined when it is destroyed.
class ArrayWriter {
 public:
  explicit ArrayWriter(bool serial = false);

  /// Creates dataset `name` in `g` with this shape and element type and writes `data` (the
  /// product of `shape` elements, row-major). Throws H5::Exception or IoFailed (naming HDF5's or
  /// zlib's reason).
  template <class T>
  void write(H5::Group& g, const std::string& name, const std::vector<std::int64_t>& shape,
             const T* data) {
    write_raw(g, name, shape, h5type<T>(), sizeof(T), data);
  }

 private:
  void write_raw(H5::Group& g, const std::string& name, const std::vector<std::int64_t>& shape,
                 const H5::PredType& type, std::size_t size, const void* data);
  void write_chunks(const H5::DataSet& ds, const ChunkGrid& grid, const unsigned char* data,
                    std::size_t size);

  bool serial_;
  WorkPool pool_;
  std::vector<ChunkScratch> scratch_;               // one per pool worker
  std::vector<std::vector<unsigned char>> packed_;  // the batch's compressed chunks
};

}  // namespace batchlens::io
