// SPDX-License-Identifier: Apache-2.0
// Facts about this build (BatchLens version, git hash, LibTorch, compiler, CUDA or not), fixed
// at compile time.
#pragma once

#include <string>

namespace batchlens::base {

/// Facts about this build, fixed at compile time. Safe to call from any thread.
struct BuildInfo {
  std::string tool_version;      ///< BatchLens version, e.g. "0.1.0"
  std::string git_hash;          ///< short hash of the source tree, or "unknown"
  std::string libtorch_version;  ///< the LibTorch headers built against, e.g. "1.13.0"
  std::string compiler;          ///< e.g. "GCC 12.2.0"
  std::string build_type;        ///< CMake build type
  bool cuda_build = false;       ///< LibTorch was built with CUDA and BatchLens probes it
};

/// The build facts of the running binary.
const BuildInfo& build_info();

}  // namespace batchlens::base
