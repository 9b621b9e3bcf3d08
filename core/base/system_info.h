// SPDX-License-Identifier: Apache-2.0
// What this machine is: CPU, its ISA and LibTorch's use of it, threads, memory, CUDA devices and
// versions. Read once at start; provenance and the Run panel's device list come from it.
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

/// The CPU's instruction sets and what LibTorch's CPU kernels make of them: the kernels (and so
/// the bits of a CPU result, and its speed) depend on them. x86-64 only; empty strings elsewhere.
struct CpuIsa {
  /// The extensions that matter to LibTorch's kernels that the CPU reports (/proc/cpuinfo
  /// flags, the cpuid bits), in a fixed order: e.g. "avx2 fma avx512f avx512bw avx512vl
  /// avx512dq avx512_vnni avx512_bf16"; AMX as "amx_tile amx_bf16 amx_int8".
  std::string flags;
  /// ATen's CPU kernel set in use, "AVX512", "AVX2" or "DEFAULT": ATEN_CPU_CAPABILITY when set to
  /// a level the CPU supports, else the best the CPU supports (ATen 1.13's rule; LibTorch does
  /// not export its own answer).
  std::string aten_capability;
  /// The ISA oneDNN's kernels use (dnnl_get_effective_cpu_isa, honours ONEDNN_MAX_CPU_ISA), e.g.
  /// "avx512_core_bf16", "avx2"; "" when this LibTorch's oneDNN cannot be asked.
  std::string onednn_isa;
  /// Who computes bf16 matmuls: "oneDNN" (LibTorch's oneDNN path on, CPU with AVX-512 BW/VL/DQ;
  /// products of at most 16^3 multiply-adds still take ATen's) or "ATen" (ATen's own kernel).
  /// An experiment's provenance adds " (BatchLens's CPU GEMM, checked bitwise at load)" when its
  /// model computed ATen's results with kernels::cpu_linear_bf16.
  std::string bf16_matmul;
  /// The ISA limits set in the environment, e.g. "ATEN_CPU_CAPABILITY=avx2
  /// ONEDNN_MAX_CPU_ISA=AVX2";
  /// "" when none is set.
  std::string caps;
};

/// The machine BatchLens runs on: what `batchlens-cli --version`, the About box and the
/// provenance of experiment files report.
struct SystemInfo {
  std::string host;              ///< host name
  std::string os;                ///< e.g. "Linux 6.1.0 x86_64"
  std::string cpu_model;         ///< from /proc/cpuinfo, or "unknown"
  CpuIsa cpu_isa;                ///< its instruction sets and LibTorch's use of them
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

/// The CPU's instruction sets now (cheap; reads /proc/cpuinfo and the environment). Never throws.
CpuIsa query_cpu_isa();

/// Seconds since this process started (its exec), from the kernel's record of the start
/// (/proc/self/stat) against CLOCK_BOOTTIME: it counts what happens before main() too, such as
/// loading LibTorch's libraries. One clock tick of resolution (10 ms); -1 where it cannot be read.
double seconds_since_process_start();

/// One line, e.g. "avx2 fma avx512f ... avx512_bf16; ATen AVX2, oneDNN avx2, bf16 matmul ATen
/// (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2)".
std::string describe(const CpuIsa& isa);

/// Formats SystemInfo as the multi-line text `batchlens-cli --version` prints after the
/// version line, e.g. "LibTorch 1.13.0\nCPU: ... (2 threads)\nCUDA: not available".
std::string describe(const SystemInfo& info);

namespace detail {
/// Fills the CUDA fields of `info` (driver, runtime, cuBLAS, GPUs). Implemented in
/// system_info_cuda.cpp when LibTorch has CUDA and in system_info_none.cpp otherwise; the
/// build picks one (CMake variable BATCHLENS_WITH_CUDA). May throw c10::Error.
void probe_cuda(SystemInfo& info);
}  // namespace detail

}  // namespace batchlens::base
