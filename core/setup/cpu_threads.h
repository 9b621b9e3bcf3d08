// SPDX-License-Identifier: Apache-2.0
// How many threads a CPU model's passes use, chosen by measurement when the model loads (issue
// #34). On a busy laptop each OpenMP region of a small product waits for a thread the machine
// does not schedule: the trained demo's decoder pass took 24 ms (native) to 411 ms (AVX2) with
// two busy processes beside it, and the one-click demo 75–124 s, against 2–9 s idle; on one
// thread it took 6.9 s. So the load times the decoder pass at LibTorch's thread count and at
// one thread, interleaved, and keeps one thread when that is clearly faster and gives the same
// bits (the whole encode + decode compared bitwise). How, never what: the numbers of an
// experiment do not depend on it. Torch-free header.
#pragma once

#include <string>

namespace batchlens::model {
class DiffusionGemma;
}

namespace batchlens::setup {

/// What choose_cpu_threads measured and chose.
struct ThreadChoice {
  int threads = 0;         ///< the calling thread's LibTorch threads from now on
  int offered = 0;         ///< LibTorch's threads before
  double ms_offered = 0;   ///< median decoder pass at `offered` threads (0: not measured)
  double ms_one = 0;       ///< median decoder pass at one thread (0: not measured)
  bool same_bits = false;  ///< one thread gave the offered threads' logits bit for bit
  /// "CPU threads: 1 of 2, chosen at load: decoder pass 12.1 ms on 1 thread, 41.0 ms on 2, the
  /// same bits", or why nothing was measured.
  std::string report;
};

/// For a CPU model when the calling thread has more than one LibTorch thread: a 4-row encode +
/// decode at both thread counts (compared bitwise), then the decoder pass timed in alternating
/// blocks of three (each block's fastest) until 5 rounds or about `budget_s` seconds; one thread
/// is kept when its median is below 0.8 of the other's and the bits agree. Sets the calling
/// thread's LibTorch threads (at:: set_num_threads: OpenMP's threads are per calling thread). A
/// model on a GPU, one thread offered, or a failure while measuring: nothing changes. Never throws.
ThreadChoice choose_cpu_threads(const model::DiffusionGemma& model, double budget_s = 2.0);

}  // namespace batchlens::setup
