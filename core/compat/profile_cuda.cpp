// SPDX-License-Identifier: Apache-2.0
// Built when LibTorch has CUDA: torch::autograd::profiler (Kineto).
#include <set>

#include <torch/csrc/autograd/profiler_kineto.h>

#include "core/compat/profile.h"

namespace batchlens::compat {

bool profiler_available() {
  return true;
}

void profile_to_file(const std::string& path, const std::function<void()>& work) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const prof::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  const std::set<ActivityType> activities{ActivityType::CPU, ActivityType::CUDA};
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  try {
    work();
  } catch (...) {
    (void)prof::disableProfiler();
    throw;
  }
  prof::disableProfiler()->save(path);
}

}  // namespace batchlens::compat
