// SPDX-License-Identifier: Apache-2.0
// Built when LibTorch has no CUDA: graphs are never supported.
#include <c10/util/Exception.h>

#include "core/compat/device_graph.h"

namespace batchlens::compat {

struct DeviceGraph::Impl {};

DeviceGraph::DeviceGraph() = default;
DeviceGraph::~DeviceGraph() = default;
DeviceGraph::DeviceGraph(DeviceGraph&&) noexcept = default;
DeviceGraph& DeviceGraph::operator=(DeviceGraph&&) noexcept = default;

bool DeviceGraph::supported(const at::Device& /*device*/) {
  return false;
}

// NOLINTNEXTLINE(readability-convert-member-functions-to-static): members in CUDA builds
void DeviceGraph::capture(const at::Device& /*device*/, const std::function<void()>& /*work*/) {
  TORCH_CHECK(false, "CUDA graphs need a LibTorch build with CUDA");
}

// NOLINTNEXTLINE(readability-convert-member-functions-to-static): members in CUDA builds
void DeviceGraph::replay() {
  TORCH_CHECK(false, "DeviceGraph::replay: nothing captured");
}

// NOLINTNEXTLINE(readability-convert-member-functions-to-static): members in CUDA builds
bool DeviceGraph::captured() const {
  return false;
}

void DeviceGraph::reset() {}

void release_cached_device_memory(const at::Device& /*device*/) {}

struct SideBranch::Impl {};

SideBranch::SideBranch(const at::Device& /*device*/, bool /*enabled*/) {}
SideBranch::~SideBranch() = default;

// NOLINTNEXTLINE(readability-convert-member-functions-to-static): members in CUDA builds
bool SideBranch::active() const {
  return false;
}

// NOLINTNEXTLINE(readability-convert-member-functions-to-static): members in CUDA builds
void SideBranch::run(const std::function<void()>& work) {
  work();
}

// NOLINTNEXTLINE(readability-convert-member-functions-to-static): members in CUDA builds
void SideBranch::join(std::initializer_list<at::Tensor> /*outputs*/) {}

}  // namespace batchlens::compat
