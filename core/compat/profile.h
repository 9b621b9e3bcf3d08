// SPDX-License-Identifier: Apache-2.0
// LibTorch's Kineto profiler behind a build-neutral interface: with CUDA (profile_cuda.cpp) it
// records host ops and device kernels; without (profile_none.cpp) it is unavailable.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/record_function.h>

namespace batchlens::compat {

/// True when this build can profile device kernels.
bool profiler_available();

/// Runs `work` under the profiler (host ops and CUDA kernels) and writes a Chrome trace (JSON,
/// "traceEvents" with "cat": "kernel" entries) to `path`. Throws c10::Error where unavailable.
void profile_to_file(const std::string& path, const std::function<void()>& work);

/// One device kernel the profiler saw, with the innermost ProfilerScope whose name starts with
/// the prefix asked for that launched it ("" when none did).
struct DeviceKernel {
  std::string name;  ///< as the GPU library reports it
  std::string scope;
  std::array<std::int64_t, 3> grid{0, 0, 0};
  std::array<std::int64_t, 3> block{0, 0, 0};
  double duration_us = 0.0;
  double start_us = 0.0;     ///< on the profiler's clock
  std::int64_t stream = -1;  ///< the stream it ran on, as the profiler numbers them (-1: unknown)
};

/// Runs `work` under the profiler and returns its device kernels in launch order, each mapped
/// to the ProfilerScope (name starting with `scope_prefix`) that was open on the launching
/// thread; kernels still queued when `work` returns are waited for. Throws c10::Error where
/// unavailable (profiler_available() false).
std::vector<DeviceKernel> profile_kernels(const std::function<void()>& work,
                                          const std::string& scope_prefix);

/// A named range (a USER_SCOPE record function) while alive, seen by the profiler; nothing when
/// `name` is null or no profiler listens.
class ProfilerScope {
 public:
  explicit ProfilerScope(const std::string* name) {
    if (name != nullptr) {
      guard_.emplace(at::RecordScope::USER_SCOPE);
      if (guard_->isActive()) {
        guard_->before(*name);
      }
    }
  }
  ProfilerScope(const ProfilerScope&) = delete;
  ProfilerScope& operator=(const ProfilerScope&) = delete;
  ProfilerScope(ProfilerScope&&) = delete;
  ProfilerScope& operator=(ProfilerScope&&) = delete;
  ~ProfilerScope() = default;

 private:
  std::optional<at::RecordFunction> guard_;
};

}  // namespace batchlens::compat
