// SPDX-License-Identifier: Apache-2.0
#include "core/ops/op_profile.h"

#include <utility>

#include "core/compat/profile.h"

namespace batchlens::ops {

bool kernel_profiler_available() {
  return compat::profiler_available();
}

std::vector<KernelSeen> profile_marked_kernels(const std::function<void()>& work) {
  std::vector<KernelSeen> out;
  for (compat::DeviceKernel& k : compat::profile_kernels(work, "bl/")) {
    out.push_back(
        KernelSeen{std::move(k.name), std::move(k.scope), k.grid, k.block, k.duration_us});
  }
  return out;
}

}  // namespace batchlens::ops
