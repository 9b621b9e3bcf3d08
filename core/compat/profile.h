// SPDX-License-Identifier: Apache-2.0
// LibTorch's Kineto profiler behind a build-neutral interface: with CUDA (profile_cuda.cpp) it
// records host ops and device kernels; without (profile_none.cpp) it is unavailable.
#pragma once

#include <functional>
#include <string>

namespace batchlens::compat {

/// True when this build can profile device kernels.
bool profiler_available();

/// Runs `work` under the profiler (host ops and CUDA kernels) and writes a Chrome trace (JSON,
/// "traceEvents" with "cat": "kernel" entries) to `path`. Throws c10::Error where unavailable.
void profile_to_file(const std::string& path, const std::function<void()>& work);

}  // namespace batchlens::compat
