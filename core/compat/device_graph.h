// SPDX-License-Identifier: Apache-2.0
// CUDA graphs behind a torch-version- and build-neutral interface: LibTorch with CUDA
// (device_graph_cuda.cpp, at::cuda::CUDAGraph) or without (device_graph_none.cpp, never
// supported). A captured graph replays the exact kernels that ran during capture, with the
// same arguments, so its results are bitwise those of the eager calls it recorded; what it
// removes is the host's per-kernel launch and dispatch cost.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>

#include <ATen/core/Tensor.h>

namespace batchlens::compat {

class DeviceGraph {
 public:
  DeviceGraph();
  ~DeviceGraph();
  DeviceGraph(const DeviceGraph&) = delete;
  DeviceGraph& operator=(const DeviceGraph&) = delete;
  DeviceGraph(DeviceGraph&& other) noexcept;
  DeviceGraph& operator=(DeviceGraph&& other) noexcept;

  /// True when this build can capture graphs on `device` (a CUDA device with LibTorch CUDA).
  static bool supported(const at::Device& device);

  /// Records what `work` launches on `device` (on a side stream, in a private memory pool).
  /// `work` must not synchronise with the host or copy between host and device; run it once
  /// eagerly first (warm-up: cuBLAS handles, kernel caches). Tensors `work` allocates stay
  /// valid, and are rewritten by every replay(). Throws c10::Error when capture fails (the
  /// graph is then empty and the device usable).
  void capture(const at::Device& device, const std::function<void()>& work);
  /// Launches the captured work on the current stream of its device.
  void replay();
  bool captured() const;
  /// Frees the graph and its memory pool.
  void reset();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Gives the blocks the caching allocator holds unused back to `device` (a CUDA device in a CUDA
/// build; a no-op otherwise). A graph captures into a pool of its own and cannot use them: before a
/// group of engines captures its graphs, the blocks an earlier group left would otherwise make the
/// capture run out of memory (the H100's 26B-A4B composition sweep: 7.8 GiB reserved unused,
/// 2 MiB missing, issue #35).
void release_cached_device_memory(const at::Device& device);

/// Two independent parts of one computation at once on one device: the side's work starts
/// after what the current stream has queued so far (the fork, at construction) and the current
/// stream waits for it (join). Each kernel reads and writes exactly what it would in line, so
/// the results are bitwise those of the work run in line; a graph captured around it gets both
/// branches. The side stream is this thread's own high-priority stream of the device (never
/// the low-priority pool stream a DeviceGraph captures on). Off CUDA, or not `enabled`, run()
/// runs the work in line and join() does nothing.
class SideBranch {
 public:
  SideBranch(const at::Device& device, bool enabled);
  /// Joins when join() was not reached (an exception left the branch), so that no later work
  /// of the current stream overtakes the side's.
  ~SideBranch();
  SideBranch(const SideBranch&) = delete;
  SideBranch& operator=(const SideBranch&) = delete;
  SideBranch(SideBranch&&) = delete;
  SideBranch& operator=(SideBranch&&) = delete;

  /// True when the work runs on a side stream.
  bool active() const;
  /// Runs `work` with the side stream as the device's current stream (in line when inactive).
  void run(const std::function<void()>& work);
  /// The current stream waits for everything run() queued. `outputs`, made on the side and read
  /// by the current stream afterwards, are marked as used by it, so that the caching allocator
  /// does not hand their memory to later side work while the current stream still reads them.
  void join(std::initializer_list<at::Tensor> outputs);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace batchlens::compat
