// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the experiment-file reader (io::read_experiment, HDF5) and the summaries that
// the CLI and the GUI compute from what it returns.
#include <cstddef>
#include <cstdint>

#include <hdf5.h>

#include "core/analysis/summary.h"
#include "core/experiment/experiment.h"
#include "core/io/experiment_file.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // HDF5 keeps freed blocks on free lists for reuse. Every input then looks like a leak to
  // libFuzzer (mallocs without frees), which runs a full LeakSanitizer pass after each one; with
  // no free lists, blocks go back to malloc at once.
  H5set_free_list_limits(0, 0, 0, 0, 0, 0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace batchlens;
  static const fuzz::InputFile file("experiment.h5");
  const auto result = io::read_experiment(file.write(data, size));
  if (!result.ok()) {
    return 0;  // FileUnrecognised, FileCorrupted, ...: the reader said no, as it should
  }
  const auto& r = result.value();
  (void)analysis::summary_text(r);
  (void)analysis::summary_json(r).dump();
  for (const auto& c : r.comparisons) {
    (void)experiment::last_step_logit_diff(r, c);
    (void)experiment::describe(c.first);
    (void)r.run(c.reference);
    (void)r.run(c.run);
  }
  return 0;
}
