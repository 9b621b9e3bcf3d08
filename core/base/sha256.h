// SPDX-License-Identifier: Apache-2.0
// SHA-256 (FIPS 180-4), for naming a tensor's bytes in a minimal repro (experiment/repro.h) so
// that whoever holds the checkpoint can check they load the same weight, and for checking a file
// brought back from a remote run. Torch-free.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "core/base/error.h"

namespace batchlens::base {

/// Incremental SHA-256: update() any number of times, then hex() once.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, std::size_t size);
  /// The digest as 64 lowercase hex digits. Ends the hash: call once.
  std::string hex();

 private:
  void block(const std::uint8_t* p);
  std::array<std::uint32_t, 8> h_{};
  std::array<std::uint8_t, 64> buf_{};
  std::size_t used_ = 0;
  std::uint64_t bytes_ = 0;
};

/// SHA-256 of `size` bytes at `data`, as 64 lowercase hex digits.
std::string sha256_hex(const void* data, std::size_t size);

/// SHA-256 of a file's bytes (read in 1 MiB blocks), as sha256_hex gives it: a file brought back
/// from another machine checked against the digest its writer printed (issue #36). Errors:
/// IoFailed naming the file. Never throws.
Result<std::string> sha256_file(const std::filesystem::path& path);

}  // namespace batchlens::base
