// SPDX-License-Identifier: Apache-2.0
// Built when LibTorch has no CUDA: no device profiler.
#include <c10/util/Exception.h>

#include "core/compat/profile.h"

namespace batchlens::compat {

bool profiler_available() {
  return false;
}

void profile_to_file(const std::string& /*path*/, const std::function<void()>& /*work*/) {
  TORCH_CHECK(false, "--profile needs a LibTorch build with CUDA");
}

std::vector<DeviceKernel> profile_kernels(const std::function<void()>& /*work*/,
                                          const std::string& /*scope_prefix*/) {
  TORCH_CHECK(false, "device kernel provenance needs a LibTorch build with CUDA");
}

}  // namespace batchlens::compat
