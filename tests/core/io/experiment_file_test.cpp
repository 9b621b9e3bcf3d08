// SPDX-License-Identifier: Apache-2.0
// Experiment files' arrays: chunks shuffled and deflated on threads, then read back bit for bit
// by our reader, by h5py and against what HDF5's own filter pipeline writes.
#include "core/io/experiment_file.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <hdf5.h>

#include "tests/support/process.h"

#include <unistd.h>

namespace batchlens::io {
namespace {

namespace fs = std::filesystem;
using experiment::ComparisonResult;
using experiment::ExperimentResult;
using experiment::NdArray;
using experiment::RunResult;

// How big a synthetic experiment is. Arrays of 4096 elements or more are chunked.
struct Sizes {
  std::int64_t ticks;
  int layers;
  int taps;
  std::int64_t canvas;
  std::int64_t tokens;  // int64, 1-D
  std::int64_t steps;   // int32, 1-D
  std::int64_t edits;   // token_diff rows, [edits, 3] int64
  std::int64_t prompt;  // prompt_ids, int64, 1-D
};

constexpr std::uint64_t kVocab = 262144;

// Every array under 4096 elements: contiguous, unfiltered.
constexpr Sizes kSmall{3, 2, 3, 16, 40, 3, 5, 30};
// [40, 128] and [40, 4, 5, 128] arrays: 40 chunks each, one tick per chunk.
constexpr Sizes kMultiChunk{40, 3, 5, 128, 5000, 4100, 1400, 5000};
// tokens: 1M + 12345 int64 (a full chunk and a partial edge chunk); steps: 2.5M int32 (two full
// chunks and an edge); pos_* [2, 2, 17, 65536] float cut into [1, 1, 1, 65536] chunks.
constexpr Sizes kHuge{2, 1, 17, 65536, (std::int64_t{1} << 20) + 12345, 2500000, 2000, 5000};

// Mostly zeros, like real files, with random bit patterns among them (NaNs and -0 included).
template <class T>
void fill(std::vector<T>& v, std::mt19937_64& rng) {
  for (auto& x : v) {
    const std::uint64_t r = rng();
    if (r % 3 == 0) {
      std::memcpy(&x, &r, sizeof(T));
    } else {
      x = T{};
    }
  }
}

template <class T>
NdArray<T> random_nd(std::vector<std::int64_t> shape, std::mt19937_64& rng) {
  NdArray<T> a(std::move(shape));
  fill(a.data, rng);
  return a;
}

template <class T>
std::vector<T> random_vec(std::int64_t n, std::mt19937_64& rng) {
  std::vector<T> v(static_cast<std::size_t>(n));
  fill(v, rng);
  return v;
}

ExperimentResult synthetic(const Sizes& z, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  ExperimentResult r;
  r.spec.model.preset = "demo";
  r.layers = z.layers;
  r.canvas_length = z.canvas;
  r.top_k = 2;
  for (int t = 0; t < z.taps; ++t) {
    r.taps.push_back("tap" + std::to_string(t));
  }
  r.prompt_ids = random_vec<std::int64_t>(z.prompt, rng);
  for (auto& x : r.prompt_ids) {
    x = static_cast<std::int64_t>(static_cast<std::uint64_t>(x) % kVocab);
  }
  const std::int64_t s = z.ticks;
  const std::int64_t c = z.canvas;
  for (const char* id : {"ref", "b2"}) {
    RunResult run;
    run.id = id;
    run.group = experiment::RunGroup::Main;
    run.canvas_in = random_nd<std::int64_t>({s, c}, rng);
    run.argmax = random_nd<std::int64_t>({s, c}, rng);
    run.sampled = random_nd<std::int64_t>({s, c}, rng);
    run.accepted = random_nd<std::uint8_t>({s, c}, rng);
    run.entropy = random_nd<float>({s, c}, rng);
    run.tick_canvas = random_vec<int>(s, rng);
    run.tick_step = random_vec<int>(s, rng);
    run.tokens = random_vec<std::int64_t>(z.tokens, rng);
    run.steps = random_vec<int>(z.steps, rng);
    // Ids and indices stay in the ranges the reader checks (token ids in the vocabulary, ticks
    // and steps >= -1); the float arrays keep random bit patterns.
    for (auto* ids : {&run.canvas_in.data, &run.argmax.data, &run.sampled.data, &run.tokens}) {
      for (auto& x : *ids) {
        x = static_cast<std::int64_t>(static_cast<std::uint64_t>(x) % kVocab);
      }
    }
    for (auto* ticks : {&run.tick_canvas, &run.tick_step, &run.steps}) {
      for (auto& x : *ticks) {
        x = static_cast<int>(static_cast<unsigned>(x) % 1000U);
      }
    }
    r.runs.push_back(std::move(run));
  }
  ComparisonResult cmp;
  cmp.id = "ref__b2";
  cmp.reference = "ref";
  cmp.run = "b2";
  const std::int64_t slots = z.layers + 1;
  cmp.frac_differ = random_nd<float>({s, slots, z.taps}, rng);
  cmp.max_abs = random_nd<float>({s, slots, z.taps}, rng);
  cmp.max_ulp = random_nd<float>({s, slots, z.taps}, rng);
  cmp.pos_frac_differ = random_nd<float>({s, slots, z.taps, c}, rng);
  cmp.pos_max_abs = random_nd<float>({s, slots, z.taps, c}, rng);
  cmp.pos_max_ulp = random_nd<float>({s, slots, z.taps, c}, rng);
  cmp.routing_flips = random_nd<std::uint8_t>({s, z.layers, c}, rng);
  cmp.router_margin = random_nd<float>({s, z.layers, c}, rng);
  cmp.sampler_diff = random_nd<std::uint8_t>({s, c}, rng);
  cmp.compared = random_vec<std::uint8_t>(s, rng);
  for (std::int64_t e = 0; e < z.edits; ++e) {
    cmp.token_diff.push_back({static_cast<text::TokenEdit::Op>(rng() % 4),
                              static_cast<std::int64_t>(rng() % z.tokens),
                              static_cast<std::int64_t>(rng() % z.tokens)});
  }
  r.comparisons.push_back(std::move(cmp));
  return r;
}

// Generated once per test program: the huge one takes a while in a Debug build.
const ExperimentResult& small_experiment() {
  static const ExperimentResult r = synthetic(kSmall, 1);
  return r;
}
const ExperimentResult& multi_chunk_experiment() {
  static const ExperimentResult r = synthetic(kMultiChunk, 2);
  return r;
}
const ExperimentResult& huge_experiment() {
  static const ExperimentResult r = synthetic(kHuge, 3);
  return r;
}

std::string temp_path(const std::string& name) {
  return (fs::path(::testing::TempDir()) /
          ("io_" + name + "_" + std::to_string(::getpid()) + ".h5"))
      .string();
}

template <class T>
void expect_bits(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if (!want.empty()) {
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(T)), 0) << what;
  }
}

template <class T>
void expect_bits(const NdArray<T>& got, const NdArray<T>& want, const std::string& what) {
  EXPECT_EQ(got.shape, want.shape) << what;
  expect_bits(got.data, want.data, what);
}

void expect_same_arrays(const ExperimentResult& got, const ExperimentResult& want) {
  expect_bits(got.prompt_ids, want.prompt_ids, "prompt_ids");
  ASSERT_EQ(got.runs.size(), want.runs.size());
  for (std::size_t i = 0; i < want.runs.size(); ++i) {
    const RunResult& a = got.runs[i];
    const RunResult& b = want.runs[i];
    const std::string at = "runs/" + b.id + "/";
    expect_bits(a.canvas_in, b.canvas_in, at + "canvas_in");
    expect_bits(a.argmax, b.argmax, at + "argmax");
    expect_bits(a.sampled, b.sampled, at + "sampled");
    expect_bits(a.accepted, b.accepted, at + "accepted");
    expect_bits(a.entropy, b.entropy, at + "entropy");
    expect_bits(a.tick_canvas, b.tick_canvas, at + "tick_canvas");
    expect_bits(a.tick_step, b.tick_step, at + "tick_step");
    expect_bits(a.tokens, b.tokens, at + "tokens");
    expect_bits(a.steps, b.steps, at + "steps");
  }
  ASSERT_EQ(got.comparisons.size(), want.comparisons.size());
  for (std::size_t i = 0; i < want.comparisons.size(); ++i) {
    const ComparisonResult& a = got.comparisons[i];
    const ComparisonResult& b = want.comparisons[i];
    const std::string at = "comparisons/" + b.id + "/";
    expect_bits(a.frac_differ, b.frac_differ, at + "frac_differ");
    expect_bits(a.max_abs, b.max_abs, at + "max_abs");
    expect_bits(a.max_ulp, b.max_ulp, at + "max_ulp");
    expect_bits(a.pos_frac_differ, b.pos_frac_differ, at + "pos_frac_differ");
    expect_bits(a.pos_max_abs, b.pos_max_abs, at + "pos_max_abs");
    expect_bits(a.pos_max_ulp, b.pos_max_ulp, at + "pos_max_ulp");
    expect_bits(a.routing_flips, b.routing_flips, at + "routing_flips");
    expect_bits(a.router_margin, b.router_margin, at + "router_margin");
    expect_bits(a.sampler_diff, b.sampler_diff, at + "sampler_diff");
    expect_bits(a.compared, b.compared, at + "compared");
    ASSERT_EQ(a.token_diff.size(), b.token_diff.size()) << at;
    for (std::size_t e = 0; e < b.token_diff.size(); ++e) {
      EXPECT_EQ(a.token_diff[e].op, b.token_diff[e].op) << at << "token_diff " << e;
      EXPECT_EQ(a.token_diff[e].ref_pos, b.token_diff[e].ref_pos) << at << "token_diff " << e;
      EXPECT_EQ(a.token_diff[e].run_pos, b.token_diff[e].run_pos) << at << "token_diff " << e;
    }
  }
}

// Every dataset the writer makes for a synthetic experiment.
std::vector<std::string> dataset_names() {
  std::vector<std::string> out{"spec/prompt_ids"};
  for (const char* run : {"ref", "b2"}) {
    for (const char* name : {"canvas_in", "argmax", "sampled", "accepted", "entropy", "tick_canvas",
                             "tick_step", "tokens", "steps"}) {
      out.push_back(std::string("runs/") + run + "/" + name);
    }
  }
  for (const char* name :
       {"frac_differ", "max_abs", "max_ulp", "compared", "pos_frac_differ", "pos_max_abs",
        "pos_max_ulp", "routing_flips", "router_margin", "sampler_diff", "token_diff"}) {
    out.push_back(std::string("comparisons/ref__b2/") + name);
  }
  return out;
}

// A dataset's storage as HDF5 reports it.
struct Storage {
  bool chunked = false;
  std::vector<hsize_t> chunk;
  std::vector<H5Z_filter_t> filters;
  unsigned deflate_level = 0;
};

Storage storage_of(const std::string& file, const std::string& name) {
  Storage s;
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  EXPECT_GE(f, 0) << file;
  const hid_t ds = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
  EXPECT_GE(ds, 0) << name;
  const hid_t plist = H5Dget_create_plist(ds);
  s.chunked = H5Pget_layout(plist) == H5D_CHUNKED;
  if (s.chunked) {
    s.chunk.resize(8);
    s.chunk.resize(static_cast<std::size_t>(H5Pget_chunk(plist, 8, s.chunk.data())));
  }
  for (int i = 0; i < H5Pget_nfilters(plist); ++i) {
    unsigned flags = 0;
    std::size_t n = 1;
    unsigned values[1] = {0};
    unsigned config = 0;
    const H5Z_filter_t id =
        H5Pget_filter2(plist, static_cast<unsigned>(i), &flags, &n, values, 0, nullptr, &config);
    s.filters.push_back(id);
    if (id == H5Z_FILTER_DEFLATE) {
      s.deflate_level = values[0];
    }
  }
  H5Pclose(plist);
  H5Dclose(ds);
  H5Fclose(f);
  return s;
}

// One stored chunk as H5Dread_chunk returns it: still shuffled and deflated.
struct StoredChunk {
  std::vector<hsize_t> offset;
  std::uint32_t mask = 0;
  std::vector<unsigned char> bytes;
};

// The chunks of dataset `name` at `offsets` (from chunk_offsets, of this file or another).
std::vector<StoredChunk> chunks_of(hid_t f, const std::string& name,
                                   const std::vector<std::vector<hsize_t>>& offsets) {
  std::vector<StoredChunk> out;
  const hid_t ds = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
  EXPECT_GE(ds, 0) << name;
  for (const auto& off : offsets) {
    StoredChunk c;
    c.offset = off;
    hsize_t size = 0;
    EXPECT_GE(H5Dget_chunk_storage_size(ds, off.data(), &size), 0) << name;
    c.bytes.resize(static_cast<std::size_t>(size));
    EXPECT_GE(H5Dread_chunk(ds, H5P_DEFAULT, off.data(), &c.mask, c.bytes.data()), 0) << name;
    out.push_back(std::move(c));
  }
  H5Dclose(ds);
  return out;
}

// Where dataset `name` has chunks stored, in HDF5's order.
std::vector<std::vector<hsize_t>> chunk_offsets(hid_t f, const std::string& name) {
  std::vector<std::vector<hsize_t>> out;
  const hid_t ds = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
  const hid_t space = H5Dget_space(ds);
  const int rank = H5Sget_simple_extent_ndims(space);
  hsize_t n = 0;
  // HDF5 1.10.8 refuses H5S_ALL here.
  EXPECT_GE(H5Dget_num_chunks(ds, space, &n), 0) << name;
  for (hsize_t i = 0; i < n; ++i) {
    std::vector<hsize_t> off(static_cast<std::size_t>(rank));
    unsigned mask = 0;
    haddr_t addr = 0;
    hsize_t size = 0;
    EXPECT_GE(H5Dget_chunk_info(ds, space, i, off.data(), &mask, &addr, &size), 0) << name;
    out.push_back(std::move(off));
  }
  H5Sclose(space);
  H5Dclose(ds);
  return out;
}

void write_and_read_back(const ExperimentResult& r, const char* label) {
  const std::string path = temp_path(label);
  ASSERT_TRUE(write_experiment(path, r).ok()) << label;
  const auto back = read_experiment(path);
  ASSERT_TRUE(back.ok()) << label << ": " << back.error().message;
  SCOPED_TRACE(label);
  expect_same_arrays(back.value(), r);
  fs::remove(path);
}

TEST(ExperimentFileArrays, SmallArraysRoundTripBitwise) {
  write_and_read_back(small_experiment(), "small");
}

TEST(ExperimentFileArrays, MultiChunkArraysRoundTripBitwise) {
  write_and_read_back(multi_chunk_experiment(), "multichunk");
}

TEST(ExperimentFileArrays, HugeArraysWithEdgeChunksRoundTripBitwise) {
  write_and_read_back(huge_experiment(), "huge");
}

TEST(ExperimentFileArrays, ChunkShapesAndFilters) {
  const std::string small = temp_path("layout_small");
  const std::string multi = temp_path("layout_multi");
  const std::string huge = temp_path("layout_huge");
  ASSERT_TRUE(write_experiment(small, small_experiment()).ok());
  ASSERT_TRUE(write_experiment(multi, multi_chunk_experiment()).ok());
  ASSERT_TRUE(write_experiment(huge, huge_experiment()).ok());
  const std::vector<H5Z_filter_t> shuffle_deflate{H5Z_FILTER_SHUFFLE, H5Z_FILTER_DEFLATE,
                                                  H5Z_FILTER_FLETCHER32};
  const std::vector<H5Z_filter_t> fletcher{H5Z_FILTER_FLETCHER32};

  // Schema 1.2: small arrays are one chunk with a checksum (they were contiguous, unchecked).
  for (const auto& name : dataset_names()) {
    const Storage s = storage_of(small, name);
    EXPECT_TRUE(s.chunked) << name;
    EXPECT_EQ(s.filters, fletcher) << name;
  }
  Storage s = storage_of(multi, "runs/ref/canvas_in");
  EXPECT_EQ(s.chunk, (std::vector<hsize_t>{1, 128}));
  EXPECT_EQ(s.filters, shuffle_deflate);
  EXPECT_EQ(s.deflate_level, 4U);
  s = storage_of(multi, "comparisons/ref__b2/pos_max_ulp");
  EXPECT_EQ(s.chunk, (std::vector<hsize_t>{1, 4, 5, 128}));
  EXPECT_EQ(s.filters, shuffle_deflate);
  s = storage_of(multi, "spec/prompt_ids");  // 5000: one chunk holding all
  EXPECT_EQ(s.chunk, (std::vector<hsize_t>{5000}));
  // 1-D arrays over 1M elements: 1M-element chunks (they used to get chunks of one element).
  s = storage_of(huge, "runs/b2/tokens");
  EXPECT_EQ(s.chunk, (std::vector<hsize_t>{hsize_t{1} << 20}));
  EXPECT_EQ(s.filters, shuffle_deflate);
  EXPECT_EQ(s.deflate_level, 4U);
  s = storage_of(huge, "runs/ref/steps");
  EXPECT_EQ(s.chunk, (std::vector<hsize_t>{hsize_t{1} << 20}));
  s = storage_of(huge, "comparisons/ref__b2/pos_frac_differ");
  EXPECT_EQ(s.chunk, (std::vector<hsize_t>{1, 1, 1, 65536}));
  EXPECT_EQ(s.filters, shuffle_deflate);
  for (const auto& p : {small, multi, huge}) {
    fs::remove(p);
  }
}

TEST(ExperimentFileArrays, H5pyReadsTheSameValuesAndFilters) {
  if (batchlens::testing::run_process({"/usr/bin/python3", "-c", "import h5py"}).exit_code != 0) {
    GTEST_SKIP() << "python3 with h5py is not installed";
  }
  const ExperimentResult& r = huge_experiment();
  const std::string path = temp_path("h5py");
  const std::string dump = temp_path("h5py_dump");
  ASSERT_TRUE(write_experiment(path, r).ok());
  // h5py writes each dataset's raw bytes (native order, as we hold them) one after another.
  const std::string script = R"(
import sys, h5py
f = h5py.File(sys.argv[1], "r")
with open(sys.argv[2], "wb") as out:
    for name in sys.argv[3:]:
        d = f[name]
        assert d.compression == "gzip" and d.compression_opts == 4 and d.shuffle, name
        out.write(d[()].tobytes())
print("ok")
)";
  const std::vector<std::string> names{"runs/ref/tokens", "runs/b2/steps", "runs/ref/accepted",
                                       "comparisons/ref__b2/pos_max_abs",
                                       "comparisons/ref__b2/token_diff"};
  std::vector<std::string> argv{"/usr/bin/python3", "-c", script, path, dump};
  argv.insert(argv.end(), names.begin(), names.end());
  const batchlens::testing::ProcessResult py = batchlens::testing::run_process(argv);
  ASSERT_EQ(py.exit_code, 0) << py.out << py.err;
  EXPECT_EQ(py.out, "ok\n");

  std::vector<char> want;
  const auto append = [&want](const void* data, std::size_t bytes) {
    const auto* c = static_cast<const char*>(data);
    want.insert(want.end(), c, c + bytes);
  };
  append(r.runs[0].tokens.data(), r.runs[0].tokens.size() * sizeof(std::int64_t));
  const std::vector<std::int32_t> steps(r.runs[1].steps.begin(), r.runs[1].steps.end());
  append(steps.data(), steps.size() * sizeof(std::int32_t));
  append(r.runs[0].accepted.data.data(), r.runs[0].accepted.data.size());
  const auto& pos = r.comparisons[0].pos_max_abs.data;
  append(pos.data(), pos.size() * sizeof(float));
  for (const auto& e : r.comparisons[0].token_diff) {
    const std::int64_t row[3] = {static_cast<std::int64_t>(e.op), e.ref_pos, e.run_pos};
    append(row, sizeof(row));
  }
  std::ifstream in(dump, std::ios::binary);
  const std::vector<char> got((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want);
  fs::remove(path);
  fs::remove(dump);
}

// WriteOptions::serial (BATCHLENS_HDF5_SERIAL=1) writes through HDF5's filter pipeline on one
// thread. Both files must hold the same values and, chunk for chunk, the same compressed bytes:
// both are shuffle + compress2 level 4 of the same zero-padded chunks.
TEST(ExperimentFileArrays, ParallelChunksMatchHdf5sOwnPipeline) {
  for (const ExperimentResult* experiment : {&multi_chunk_experiment(), &huge_experiment()}) {
    const ExperimentResult& r = *experiment;
    const std::string serial = temp_path("serial");
    const std::string parallel = temp_path("parallel");
    WriteOptions one_thread;
    one_thread.serial = true;
    ASSERT_TRUE(write_experiment(serial, r, one_thread).ok());
    ASSERT_TRUE(write_experiment(parallel, r).ok());
    const auto a = read_experiment(serial);
    const auto b = read_experiment(parallel);
    ASSERT_TRUE(a.ok() && b.ok());
    expect_same_arrays(a.value(), r);
    expect_same_arrays(b.value(), r);

    const hid_t fa = H5Fopen(serial.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    const hid_t fb = H5Fopen(parallel.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(fa, 0);
    ASSERT_GE(fb, 0);
    std::size_t compared = 0;
    for (const auto& name : dataset_names()) {
      if (!storage_of(serial, name).chunked) {
        continue;
      }
      const auto offsets = chunk_offsets(fa, name);
      EXPECT_EQ(chunk_offsets(fb, name).size(), offsets.size()) << name;
      const auto want = chunks_of(fa, name, offsets);
      const auto got = chunks_of(fb, name, offsets);
      for (std::size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(got[i].mask, 0U) << name << " chunk " << i;
        EXPECT_EQ(want[i].mask, 0U) << name << " chunk " << i;
        EXPECT_TRUE(got[i].bytes == want[i].bytes) << name << " chunk " << i;
        ++compared;
      }
    }
    EXPECT_GT(compared, 100U);
    H5Fclose(fa);
    H5Fclose(fb);
    fs::remove(serial);
    fs::remove(parallel);
  }
}

}  // namespace
}  // namespace batchlens::io
