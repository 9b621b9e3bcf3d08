// SPDX-License-Identifier: Apache-2.0
// Sweep files (issue #19) travel between people and clusters: they round-trip every field, read
// with h5py alone, and a damaged, truncated or foreign file is refused with a reason, never a
// crash.
#include "core/io/sweep_file.h"

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <hdf5.h>
#include <nlohmann/json.hpp>

#include "core/analysis/sweep_report.h"
#include "core/experiment/runner.h"
#include "core/io/experiment_file.h"
#include "tests/support/file_damage.h"
#include "tests/support/process.h"

#include <sys/wait.h>
#include <unistd.h>

namespace batchlens::io {
namespace {

namespace fs = std::filesystem;
using analysis::SweepRecords;
using analysis::SweepRow;
using base::ErrorCode;

fs::path temp(const std::string& name) {
  return fs::path(::testing::TempDir()) /
         ("bl_sweepfile_" + std::to_string(::getpid()) + "_" + name);
}

// Three prompts x two seeds, B=2 and 4, main and workaround; item 5 not finished; rows from
// two machines, two shards.
SweepRecords known_records() {
  SweepRecords s;
  s.spec.base.model.preset = "tiny";
  s.spec.base.batch_sizes = {2, 4};
  s.spec.base.workaround = ops::OpPolicy::issue_workaround();
  s.spec.prompts = {{"Write about Lisbon.", true, {}},
                    {"caf\xC3\xA9 \"quoted\"\n", false, {}},
                    {"", true, {2, 106, 9}}};
  s.spec.seeds = {0, 7};
  s.id = analysis::sweep_id(s.spec);
  s.items_total = 6;
  s.items_done = 5;
  experiment::Provenance a;
  a.host = "node-a";
  a.device = "cuda:0";
  a.device_name = "NVIDIA H200";
  a.driver = "580.1";
  experiment::Provenance b = a;
  b.host = "node-b";
  b.device_name = "NVIDIA H100 80GB HBM3";
  s.provenances = {a, b};
  for (int item = 0; item < 5; ++item) {
    for (const experiment::RunGroup group :
         {experiment::RunGroup::Main, experiment::RunGroup::Workaround}) {
      for (int bs : {2, 4}) {
        SweepRow r;
        r.item = item;
        r.prompt = item / 2;
        r.seed = item % 2 == 0 ? 0 : 7;
        r.group = group;
        r.batch_size = bs;
        r.text_changed = group == experiment::RunGroup::Main && item != 3;
        r.tokens_changed = r.text_changed ? 10 * item + bs : 0;
        r.tokens_total = 64;
        r.stop_changed = item == 1;
        r.steps_changed = item == 2;
        if (r.text_changed) {
          r.first_canvas = 0;
          r.first_step = 2;
          r.first_layer = 29;
          r.first_tap = "selfcond.out";
          r.first_families = "selfcond_matmul";
        }
        r.wall_s = 1.25 * item;
        r.provenance = item % 2;
        s.rows.push_back(r);
      }
    }
  }
  s.shards = {{0, 2, 0, 3}, {1, 2, 1, 2}};
  return s;
}

nlohmann::json everything(const SweepRecords& s) {
  nlohmann::json j = analysis::sweep_json(s);
  j["items_done"] = s.items_done;
  return j;
}

TEST(SweepFile, RoundTripsEveryField) {
  const SweepRecords s = known_records();
  const fs::path f = temp("round.h5");
  ASSERT_TRUE(write_sweep_file(f, s).ok());
  const auto back = read_sweep_file(f);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(everything(back.value()), everything(s));
  EXPECT_EQ(analysis::to_json(back.value().spec), analysis::to_json(s.spec));
  EXPECT_EQ(back.value().rows.size(), 20U);
  // Summary reads the same through read_sweep.
  EXPECT_TRUE(read_sweep(f).ok());
  fs::remove(f);
}

TEST(SweepFile, InconsistentRecordsAreNotWritten) {
  SweepRecords s = known_records();
  s.rows[3].item = 99;
  const fs::path f = temp("bad.h5");
  const auto w = write_sweep_file(f, s);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error().code, ErrorCode::InvalidArgument);
  EXPECT_FALSE(fs::exists(f));
  s = known_records();
  s.rows[1].provenance = 5;
  EXPECT_FALSE(write_sweep_file(f, s).ok());
  s = known_records();
  s.rows.push_back(s.rows.front());  // a row twice
  EXPECT_FALSE(write_sweep_file(f, s).ok());
  s = known_records();
  s.id = "0000000000000000";  // not its spec's
  EXPECT_FALSE(write_sweep_file(f, s).ok());
  EXPECT_FALSE(fs::exists(f));
}

TEST(SweepFile, ReadsWithH5pyAlone) {
  if (testing::run_process({"/usr/bin/python3", "-c", "import h5py"}).exit_code != 0) {
    // CI installs python3-h5py (scripts/install-deps.sh); a GPU server may not have it.
    GTEST_SKIP() << "h5py is not installed for /usr/bin/python3";
  }
  const fs::path f = temp("h5py.h5");
  ASSERT_TRUE(write_sweep_file(f, known_records()).ok());
  const std::string script =
      "import h5py, json, sys\n"
      "f = h5py.File(sys.argv[1], 'r')\n"
      "assert f.attrs['format'] == b'batchlens-sweep', f.attrs['format']\n"
      "r = f['rows']\n"
      "n = len(r['item'])\n"
      "spec = json.loads(f['spec_json'][()])\n"
      "prov = [json.loads(p) for p in f['provenance/json'][:]]\n"
      "changed = sum(int(c) for c, g, b in zip(r['text_changed'][:], r['group'][:], "
      "r['batch_size'][:]) if g == b'main' and b == 2)\n"
      "hosts = sorted({prov[i]['host'] for i in r['provenance'][:]})\n"
      "print(n, changed, len(spec['prompts']), ','.join(hosts), "
      "r['first_families'][0].decode(), list(f['shards/index'][:]))\n";
  const auto r = testing::run_process({"/usr/bin/python3", "-c", script, f.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "20 4 3 node-a,node-b selfcond_matmul [0, 1]\n");
  // A file whose dataset is a link to another file, or keeps its data in an external file, is
  // refused before anything is read through it.
  const fs::path linked = temp("linked.h5");
  const std::string craft =
      "import h5py, shutil, sys\n"
      "shutil.copy(sys.argv[1], sys.argv[2])\n"
      "f = h5py.File(sys.argv[2], 'r+')\n"
      "del f['provenance/json']\n"
      "f['provenance/json'] = h5py.ExternalLink('/etc/hostname', '/x')\n"
      "del f['rows/first_tap']\n"
      "f['rows'].create_dataset('first_tap', shape=(20,), dtype='S8', "
      "external=[('/etc/hostname', 0, 160)])\n";
  ASSERT_EQ(testing::run_process({"/usr/bin/python3", "-c", craft, f.string(), linked.string()})
                .exit_code,
            0);
  const auto refused = read_sweep_file(linked);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::FileCorrupted);
  EXPECT_NE(refused.error().message.find("external files"), std::string::npos)
      << refused.error().message;
  fs::remove(linked);
  fs::remove(f);
}

TEST(SweepFile, DamagedTruncatedAndForeignFilesAreRefused) {
  const fs::path f = temp("good.h5");
  ASSERT_TRUE(write_sweep_file(f, known_records()).ok());
  std::ifstream in(f, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const fs::path d = temp("damaged.h5");
  const auto put = [&](const std::string& b) {
    std::ofstream(d, std::ios::binary) << b;
  };
  // Truncated anywhere: an error, never a crash.
  for (std::size_t cut : {std::size_t{8}, std::size_t{100}, bytes.size() / 2, bytes.size() - 1}) {
    put(bytes.substr(0, cut));
    const auto r = read_sweep_file(d);
    EXPECT_FALSE(r.ok()) << "cut at " << cut;
  }
  // Seeded byte flips: every read returns (an error, or the same records when the byte was not
  // used); never a crash, never different records.
  std::mt19937 rng(19);
  std::uniform_int_distribution<std::size_t> at(0, bytes.size() - 1);
  const nlohmann::json good = everything(known_records());
  int refused = 0;
  for (int k = 0; k < 300; ++k) {
    std::string b = bytes;
    b[at(rng)] ^= static_cast<char>(1U << (k % 8));
    put(b);
    const auto r = read_sweep_file(d);
    if (r.ok()) {
      EXPECT_EQ(everything(r.value()), good) << "flip " << k;
    } else {
      ++refused;
    }
  }
  EXPECT_GT(refused, 100);
  // Not HDF5; HDF5 of another kind.
  put("not a sweep file at all");
  EXPECT_EQ(read_sweep_file(d).error().code, ErrorCode::FileUnrecognised);
  experiment::ExperimentSpec spec;
  spec.model.preset = "tiny";
  spec.overrides.max_denoising_steps = 2;
  spec.overrides.max_new_tokens = 16;
  spec.batch_sizes = {2};
  spec.kernels = false;
  const auto e = experiment::run_experiment(spec);
  ASSERT_TRUE(e.ok()) << e.error().message;
  ASSERT_TRUE(write_experiment(d, e.value()).ok());
  const auto other = read_sweep_file(d);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.error().code, ErrorCode::FileUnrecognised) << other.error().message;
  EXPECT_EQ(read_sweep_file(temp("missing.h5")).error().code, ErrorCode::FileNotFound);
  fs::remove(f);
  fs::remove(d);
}

// As for experiment files: 100 damaged sweep files leave no HDF5 object open (issue #32).
TEST(SweepFileHandles, DamagedFilesLeaveNoHdf5ObjectOpen) {
  const fs::path good = temp("handles_good.h5");
  ASSERT_TRUE(write_sweep_file(good, known_records()).ok());
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_TRUE(read_sweep_file(good).ok());  // the library's own identifiers exist from here on
  const std::vector<hsize_t> before = testing::open_hdf5_ids();
  std::mt19937_64 rng(33);
  const fs::path p = temp("handles_damaged.h5");
  int refused = 0;
  for (int i = 0; i < 100; ++i) {
    const std::string m = testing::damaged(bytes, rng, i);
    std::ofstream(p, std::ios::binary | std::ios::trunc) << m;
    refused += read_sweep_file(p).ok() ? 0 : 1;
    ASSERT_EQ(testing::open_hdf5_ids(), before)
        << "damaged sweep file " << i << " left an HDF5 identifier open";
  }
  EXPECT_GT(refused, 25);
  fs::remove(good);
  fs::remove(p);
}

// 0: read and equal to `want` in every field; 1: refused; 2: read but different; 3: hung;
// 128 + signal: crashed. In a child process, so a crash or hang is a result, not the end.
int read_sweep_in_child(const fs::path& path, const SweepRecords& want, int seconds) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(static_cast<unsigned>(seconds));
    const auto r = read_sweep_file(path);
    if (!r.ok()) {
      ::_exit(1);
    }
    ::_exit(everything(r.value()) == everything(want) ? 0 : 2);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) {
    return WTERMSIG(status) == SIGALRM ? 3 : 128 + WTERMSIG(status);
  }
  return WEXITSTATUS(status);
}

// 1,000 seeded mutations of a current sweep file, as for experiment files: each detected or
// harmless, never changed-undetected (issue #32; docs/reliability.md). Slow: release build only.
TEST(SweepFileMutations, EveryMutationIsDetectedOrHarmless) {
  const SweepRecords s = known_records();
  const fs::path good = temp("mutation_good.h5");
  ASSERT_TRUE(write_sweep_file(good, s).ok());
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_GT(bytes.size(), 1000U);
  std::mt19937_64 rng(20261205);
  const fs::path p = temp("mutated.h5");
  int detected = 0;
  int harmless = 0;
  constexpr int kMutations = 1000;
  const testing::MutationTally t =
      testing::run_mutations(bytes, p, rng, kMutations,
                             [&s](const std::string& f) { return read_sweep_in_child(f, s, 20); });
  ASSERT_TRUE(t.failure.empty()) << t.failure;
  detected = t.detected;
  harmless = t.harmless;
  RecordProperty("detected", detected);
  RecordProperty("harmless", harmless);
  std::printf(
      "sweep file, %zu bytes: %d mutations, %d detected, %d harmless, 0 "
      "changed-undetected\n",
      bytes.size(), kMutations, detected, harmless);
  EXPECT_GT(detected, kMutations / 4);
  fs::remove(good);
  fs::remove(p);
}

}  // namespace
}  // namespace batchlens::io
