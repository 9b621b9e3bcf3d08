// SPDX-License-Identifier: Apache-2.0
// Seeded damage to a file's bytes, and the HDF5 identifiers a process holds: shared by the
// experiment-file and sweep-file hardening tests (issue #32).
#pragma once

#include <algorithm>
#include <cstddef>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <hdf5.h>

namespace batchlens::testing {

/// Mutation `i` of `bytes`: even `i` flips one bit, odd `i` overwrites 1 to 8 bytes with random
/// values. `at` receives the first byte changed.
inline std::string mutated(std::string bytes, std::mt19937_64& rng, int i, std::size_t& at) {
  at = rng() % bytes.size();
  if (i % 2 == 0) {
    bytes[at] = static_cast<char>(bytes[at] ^ (1U << (rng() % 8)));
  } else {
    const std::size_t n = 1 + rng() % 8;
    for (std::size_t k = at; k < std::min(bytes.size(), at + n); ++k) {
      bytes[k] = static_cast<char>(rng());
    }
  }
  return bytes;
}

/// Damage `i` of `bytes`: every fourth truncated at a random length, the others with 1 to 8
/// random bytes at a random place.
inline std::string damaged(std::string bytes, std::mt19937_64& rng, int i) {
  if (i % 4 == 3) {
    bytes.resize(rng() % bytes.size());
    return bytes;
  }
  const std::size_t at = rng() % bytes.size();
  for (std::size_t k = at; k < std::min(bytes.size(), at + 1 + i % 8); ++k) {
    bytes[k] = static_cast<char>(rng());
  }
  return bytes;
}

/// Every HDF5 identifier this process holds, by type: files, groups, datasets, attributes,
/// dataspaces, datatypes, property lists and error stacks (H5Fget_obj_count sees only the first
/// four; what stays open makes HDF5 print "infinite loop closing library" at exit).
inline std::vector<hsize_t> open_hdf5_ids() {
  std::vector<hsize_t> out;
  for (const H5I_type_t type :
       {H5I_FILE, H5I_GROUP, H5I_DATASET, H5I_ATTR, H5I_DATASPACE, H5I_DATATYPE, H5I_GENPROP_LST,
        H5I_ERROR_CLASS, H5I_ERROR_MSG, H5I_ERROR_STACK}) {
    hsize_t n = 0;
    H5Inmembers(type, &n);
    out.push_back(n);
  }
  return out;
}

/// What the mutation tests found: mutated copies of a file read in a child process each.
struct MutationTally {
  int detected = 0;     ///< refused with an error
  int harmless = 0;     ///< every dataset and attribute read equals the original's
  std::string failure;  ///< the first mutation that was neither (changed-undetected, hung,
                        ///< crashed); empty when none
};

/// Writes `count` seeded mutations of `bytes` to `path` one by one and classifies each with
/// `read_in_child(path)`: 0 harmless, 1 detected, 2 changed-undetected, 3 hung, 128+n signal n.
/// Stops at the first failure.
inline MutationTally run_mutations(const std::string& bytes, const std::string& path,
                                   std::mt19937_64& rng, int count,
                                   const std::function<int(const std::string&)>& read_in_child) {
  MutationTally t;
  for (int i = 0; i < count; ++i) {
    std::size_t at = 0;
    const std::string m = mutated(bytes, rng, i, at);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << m;
    const int outcome = read_in_child(path);
    if (outcome != 0 && outcome != 1) {
      t.failure = "mutation " + std::to_string(i) + " at byte " + std::to_string(at) + ": " +
                  (outcome == 2   ? "read without error but contents differ (changed-undetected)"
                   : outcome == 3 ? std::string("hung")
                                  : "crashed with signal " + std::to_string(outcome - 128));
      return t;
    }
    (outcome == 0 ? t.harmless : t.detected) += 1;
  }
  return t;
}

}  // namespace batchlens::testing
