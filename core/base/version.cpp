// SPDX-License-Identifier: Apache-2.0
#include "core/base/version.h"

#include <torch/version.h>

namespace batchlens::base {

namespace {

std::string compiler_string() {
#if defined(__clang__)
  return "Clang " __clang_version__;
#elif defined(__GNUC__)
  return "GCC " __VERSION__;
#else
  return "unknown compiler";
#endif
}

}  // namespace

const BuildInfo& build_info() {
  static const BuildInfo info = [] {
    BuildInfo b;
    b.tool_version = BL_TOOL_VERSION;
    b.git_hash = BL_GIT_HASH;
    b.libtorch_version = TORCH_VERSION;
    b.compiler = compiler_string();
    b.build_type = BL_BUILD_TYPE;
#if defined(BL_WITH_CUDA)
    b.cuda_build = true;
#endif
    return b;
  }();
  return info;
}

}  // namespace batchlens::base
