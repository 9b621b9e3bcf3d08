// SPDX-License-Identifier: Apache-2.0
// Built when LibTorch has CUDA: at::cuda::CUDAGraph.
#include <memory>

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "core/compat/device_graph.h"

namespace batchlens::compat {

struct DeviceGraph::Impl {
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  at::Device device{at::kCPU};
};

DeviceGraph::DeviceGraph() : impl_(std::make_unique<Impl>()) {}
DeviceGraph::~DeviceGraph() = default;
DeviceGraph::DeviceGraph(DeviceGraph&&) noexcept = default;
DeviceGraph& DeviceGraph::operator=(DeviceGraph&&) noexcept = default;

bool DeviceGraph::supported(const at::Device& device) {
  return device.is_cuda();
}

void DeviceGraph::capture(const at::Device& device, const std::function<void()>& work) {
  TORCH_CHECK(device.is_cuda(), "DeviceGraph::capture: not a CUDA device: ", device.str());
  reset();
  const c10::cuda::CUDAGuard guard(device);
  // Work queued on the current stream must finish before the side stream starts.
  const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(device.index());
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device.index());
  side.synchronize();
  caller.synchronize();
  impl_->graph = std::make_unique<at::cuda::CUDAGraph>();
  impl_->device = device;
  {
    const c10::cuda::CUDAStreamGuard on_side(side);
    try {
      impl_->graph->capture_begin();
      work();
      impl_->graph->capture_end();
    } catch (...) {
      // End the capture before giving up: capture_end releases the allocator's private pool
      // and ends the stream's (global-mode) capture. Left capturing, every later CUDA call of
      // the process fails with "operation not permitted when stream is capturing". It throws
      // here (the capture was invalidated); that error and CUDA's sticky one are dropped.
      try {
        impl_->graph->capture_end();
      } catch (...) {
      }
      (void)cudaGetLastError();
      // A graph whose capture failed is abandoned, not destroyed: its destructor unregisters
      // it from the RNG states it registered with, which a failed capture_end can leave
      // inconsistent, and then aborts the process (seen on the H200 after an out-of-memory
      // capture). Its private pool is handed back to the caching allocator (what the
      // destructor would do) so that the memory of the failed capture is not lost; the engine
      // then runs eager.
      try {
        c10::cuda::CUDACachingAllocator::releasePool(device.index(), impl_->graph->pool());
      } catch (...) {
      }
      (void)impl_->graph.release();
      throw;
    }
  }
  side.synchronize();
}

void DeviceGraph::replay() {
  TORCH_CHECK(impl_->graph != nullptr, "DeviceGraph::replay: nothing captured");
  const c10::cuda::CUDAGuard guard(impl_->device);
  impl_->graph->replay();
}

bool DeviceGraph::captured() const {
  return impl_ && impl_->graph != nullptr;
}

void DeviceGraph::reset() {
  if (impl_) {
    impl_->graph.reset();
  }
}

void release_cached_device_memory(const at::Device& device) {
  if (device.is_cuda()) {
    c10::cuda::CUDACachingAllocator::emptyCache();
  }
}

}  // namespace batchlens::compat
