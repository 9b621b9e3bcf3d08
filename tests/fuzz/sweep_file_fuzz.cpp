// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the sweep-file reader (io::read_sweep_file, HDF5; issue #19) and what the CLI and
// the GUI compute from what it returns: the summary text and JSON, the statistics, the items
// still missing, a merge with itself refused or accepted, a shard's part.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <hdf5.h>

#include "core/analysis/sweep_merge.h"
#include "core/analysis/sweep_report.h"
#include "core/analysis/sweep_stats.h"
#include "core/io/sweep_file.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // As fuzz_experiment_file: no HDF5 free lists, so freed blocks do not look like leaks.
  H5set_free_list_limits(0, 0, 0, 0, 0, 0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace batchlens;
  static const fuzz::InputFile file("sweep.h5");
  const auto result = io::read_sweep_file(file.write(data, size));
  if (!result.ok()) {
    return 0;  // FileUnrecognised, FileCorrupted, ...: the reader said no, as it should
  }
  const auto& s = result.value();
  (void)analysis::sweep_text(s);
  (void)analysis::sweep_json(s).dump();
  (void)analysis::sweep_stats(s.spec, s.rows);
  (void)analysis::sweep_stats(s.spec, analysis::rows_where(s.spec, s.rows, 0, 0), {false, false});
  (void)analysis::missing_items(s);
  (void)analysis::merge_sweeps({s, s}, {"a", "b"});
  if (!s.provenances.empty()) {
    (void)analysis::shard_records(s, {0, 2}, s.provenances.front());
  }
  return 0;
}
