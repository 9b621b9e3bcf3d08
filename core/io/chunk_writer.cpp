// SPDX-License-Identifier: Apache-2.0
#include "core/io/chunk_writer.h"

#include <algorithm>
#include <cstdlib>

#include "core/base/error.h"

#include <zlib.h>

namespace batchlens::io {

namespace {

constexpr std::int64_t kMinChunkedElements = 4096;  // smaller arrays: one chunk, checksum only
constexpr hsize_t kMaxChunkElements = hsize_t{1} << 20;
constexpr int kDeflateLevel = 4;
// Raw bytes compressed per batch before their chunks are written: bounds what a huge array holds
// in compressed chunks at once (about this much, a little more if it does not compress at all).
constexpr std::size_t kBatchBytes = std::size_t{64} << 20;
constexpr unsigned kMaxThreads = 16;

}  // namespace

// ---- WorkPool ------------------------------------------------------------------------------

WorkPool::WorkPool(std::size_t max_threads) : max_threads_(std::max<std::size_t>(1, max_threads)) {}

WorkPool::~WorkPool() {
  {
    const std::lock_guard<std::mutex> lock(m_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : helpers_) {
    t.join();
  }
}

void WorkPool::run(std::size_t n, const Job& job) {
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

void WorkPool::work(std::size_t worker) {
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

void WorkPool::helper_loop(std::size_t worker) {
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

// ---- filters -------------------------------------------------------------------------------

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

void append_fletcher32(std::vector<unsigned char>& chunk) {
  const std::uint32_t sum = fletcher32(chunk.data(), chunk.size());
  for (unsigned k = 0; k < 4; ++k) {
    chunk.push_back(static_cast<unsigned char>(sum >> (8U * k)));
  }
}

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
    base::raise(base::ErrorCode::IoFailed, std::string("zlib cannot compress a chunk: ") +
                                               zError(status) + " (" + std::to_string(status) +
                                               ")");
  }
  out.assign(scratch.packed.begin(), scratch.packed.begin() + static_cast<std::ptrdiff_t>(packed));
  append_fletcher32(out);
}

// ---- chunk geometry ------------------------------------------------------------------------

std::pair<hsize_t, hsize_t> ChunkGrid::span(hsize_t t) const {
  const hsize_t r = t / per_row;
  const hsize_t j = t % per_row;
  const hsize_t c = chunk[split];
  return {(r * dims[split] + j * c) * inner, std::min(c, dims[split] - j * c) * inner};
}

void ChunkGrid::offset(hsize_t t, std::vector<hsize_t>& out) const {
  out.assign(dims.size(), 0);
  out[split] = (t % per_row) * chunk[split];
  hsize_t r = t / per_row;
  for (std::size_t k = split; k-- > 0;) {
    out[k] = r % dims[k];
    r /= dims[k];
  }
}

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

// ---- ArrayWriter ---------------------------------------------------------------------------

ArrayWriter::ArrayWriter(bool serial)
    : serial_(serial),
      pool_(std::min(std::max(1U, std::thread::hardware_concurrency()), kMaxThreads)),
      scratch_(pool_.max_threads()) {}

void ArrayWriter::write_raw(H5::Group& g, const std::string& name,
                            const std::vector<std::int64_t>& shape, const H5::PredType& type,
                            std::size_t size, const void* data) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    n *= d;
  }
  const H5::DataSpace space(static_cast<int>(dims.size()), dims.data());
  H5::DSetCreatPropList plist;
  if (n == 0) {
    g.createDataSet(name, type, space, plist);  // no data, nothing to checksum
    return;
  }
  if (n < kMinChunkedElements) {
    // One chunk holding the whole array, Fletcher-32 only (schema 1.2; was contiguous).
    plist.setChunk(static_cast<int>(dims.size()), dims.data());
    plist.setFletcher32();
    H5::DataSet ds = g.createDataSet(name, type, space, plist);
    ds.write(data, type);
    return;
  }
  // Shuffle + gzip (the arrays are mostly zeros) + Fletcher-32.
  const ChunkGrid grid = chunk_grid(dims);
  plist.setChunk(static_cast<int>(grid.chunk.size()), grid.chunk.data());
  plist.setShuffle();
  plist.setDeflate(kDeflateLevel);
  plist.setFletcher32();
  H5::DataSet ds = g.createDataSet(name, type, space, plist);
  if (serial_) {
    ds.write(data, type);
  } else {
    write_chunks(ds, grid, static_cast<const unsigned char*>(data), size);
  }
}

void ArrayWriter::write_chunks(const H5::DataSet& ds, const ChunkGrid& grid,
                               const unsigned char* data, std::size_t size) {
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
        base::raise(base::ErrorCode::IoFailed,
                    "HDF5 cannot write chunk " + std::to_string(first + i) + " of " +
                        ds.getObjName() + " (" + hdf5_error_text() + ")");
      }
    }
  }
  packed_.clear();
}

}  // namespace batchlens::io
