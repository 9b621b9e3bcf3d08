// SPDX-License-Identifier: Apache-2.0
// Built when LibTorch has CUDA: at::cuda::CUDAGraph, and side streams for SideBranch.
#include <map>
#include <memory>

#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
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

namespace {

// This thread's side stream of device `index`: one per thread and device, so that a capture on
// one thread never takes in another thread's side work, and the same one for a warm-up and the
// capture after it (cuBLAS keeps a workspace per stream). High priority: the side's kernels are
// the short branch, and start as soon as SMs free up.
c10::cuda::CUDAStream side_stream(c10::DeviceIndex index) {
  thread_local std::map<c10::DeviceIndex, c10::cuda::CUDAStream> streams;
  auto it = streams.find(index);
  if (it == streams.end()) {
    it = streams.emplace(index, c10::cuda::getStreamFromPool(/*isHighPriority=*/true, index)).first;
  }
  return it->second;
}

// `waiter` waits for the work queued on `on` so far (in a capture: a dependency of the graph).
void wait_for(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& on) {
  at::cuda::CUDAEvent event;
  event.record(on);
  event.block(waiter);
}

}  // namespace

struct SideBranch::Impl {
  c10::cuda::CUDAStream main;
  c10::cuda::CUDAStream side;
  bool joined = false;
};

SideBranch::SideBranch(const at::Device& device, bool enabled) {
  if (!enabled || !device.is_cuda()) {
    return;
  }
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  const c10::cuda::CUDAStream main = c10::cuda::getCurrentCUDAStream(index);
  const c10::cuda::CUDAStream side = side_stream(index);
  if (side == main) {
    return;  // already on it (a branch inside a branch): in line
  }
  wait_for(side, main);
  impl_ = std::make_unique<Impl>(Impl{main, side, false});
}

SideBranch::~SideBranch() {
  if (impl_ && !impl_->joined) {
    try {
      wait_for(impl_->main, impl_->side);
    } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor; the error is the caller's
    }
  }
}

bool SideBranch::active() const {
  return impl_ != nullptr;
}

void SideBranch::run(const std::function<void()>& work) {
  if (!impl_) {
    work();
    return;
  }
  const c10::cuda::CUDAStreamGuard on_side(impl_->side);
  work();
}

void SideBranch::join(std::initializer_list<at::Tensor> outputs) {
  if (!impl_ || impl_->joined) {
    return;
  }
  wait_for(impl_->main, impl_->side);
  impl_->joined = true;
  for (const at::Tensor& t : outputs) {
    if (t.defined() && t.is_cuda()) {
      t.record_stream(impl_->main);
    }
  }
}

}  // namespace batchlens::compat
