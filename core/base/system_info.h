// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/error.h"

namespace batchlens::base {

/// One CUDA device as the CUDA runtime describes it.
struct GpuInfo {
  int index = 0;
  std::string name;               ///< e.g. "NVIDIA H200"
  std::int64_t total_memory = 0;  ///< bytes
  int compute_major = 0;          ///< compute capability, e.g. 9
  int compute_minor = 0;          ///< e.g. 0
  int multiprocessors = 0;        ///< SM count
};

/// The machine BatchLens runs on: what `batchlens-cli --version`, the About box and the
/// provenance of experiment files report.
struct SystemInfo {
  std::string host;              ///< host name
  std::string os;                ///< e.g. "Linux 6.1.0 x86_64"
  std::string cpu_model;         ///< from /proc/cpuinfo, or "unknown"
  int hardware_threads = 0;      ///< logical CPUs the OS reports
  int torch_threads = 0;         ///< LibTorch intra-op threads in use
  std::string libtorch_version;  ///< LibTorch linked at build time
  std::string blas;              ///< BLAS LibTorch uses on CPU, e.g. "generic", "open", "mkl"
  bool mkldnn = false;           ///< oneDNN available to LibTorch on CPU
  bool cuda_build = false;       ///< this binary can use CUDA at all
  int cuda_driver_version = 0;   ///< e.g. 13000 for CUDA 13.0; 0 without a driver
  int cuda_runtime_version = 0;  ///< the CUDA runtime LibTorch uses; 0 without CUDA
  std::string cudnn_version;     ///< e.g. "9.10.2", empty without cuDNN
  std::string cublas_version;    ///< e.g. "13.0.0", empty without cuBLAS
  std::string gpu_driver;        ///< NVIDIA kernel driver version, e.g. "580.159.04", or empty
  std::vector<GpuInfo> gpus;     ///< visible CUDA devices, empty on CPU-only machines
};

/// Queries the host, LibTorch and the CUDA runtime. Safe from any thread; takes a few ms
/// (plus CUDA initialisation the first time on a GPU machine). Never throws.
Result<SystemInfo> query_system_info();

/// Sets LibTorch's intra-op thread count; 0 means one per hardware thread. LibTorch starts
/// with 1 on some VMs (docs/build.md), so both apps call this at start. Call before any work
/// runs; not thread-safe with running LibTorch work.
void configure_threads(int threads);

/// Formats SystemInfo as the multi-line text `batchlens-cli --version` prints after the
/// version line, e.g. "LibTorch 1.13.0\nCPU: ... (2 threads)\nCUDA: not available".
std::string describe(const SystemInfo& info);

}  // namespace batchlens::base
