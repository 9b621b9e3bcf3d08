// SPDX-License-Identifier: Apache-2.0
// The device kernels of work the op layer marked (OpObserver::marks), for kernel provenance:
// the profiler as the op layer sees it (compat/profile.h underneath).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace batchlens::ops {

/// One device kernel and the op mark ("bl/<family>/<layer>") that launched it ("" if none).
struct KernelSeen {
  std::string name;
  std::string scope;
  std::array<std::int64_t, 3> grid{0, 0, 0};
  std::array<std::int64_t, 3> block{0, 0, 0};
  double duration_us = 0.0;
};

/// True when this build can see device kernels (LibTorch with CUDA).
bool kernel_profiler_available();

/// Runs `work` under the profiler; its device kernels in launch order. Throws c10::Error where
/// unavailable.
std::vector<KernelSeen> profile_marked_kernels(const std::function<void()>& work);

}  // namespace batchlens::ops
