// SPDX-License-Identifier: Apache-2.0
#include "core/base/system_info.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <sstream>
#include <thread>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>

#include "core/base/cuda_probe.h"
#include "core/base/version.h"

#include <sys/utsname.h>
#include <unistd.h>

namespace batchlens::base {

namespace {

std::string host_name() {
  std::array<char, 256> buf{};
  if (gethostname(buf.data(), buf.size() - 1) != 0) {
    return "unknown";
  }
  return buf.data();
}

std::string os_string() {
  utsname u{};
  if (uname(&u) != 0) {
    return "unknown";
  }
  return std::string(u.sysname) + " " + u.release + " " + u.machine;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) {
        return line.substr(line.find_first_not_of(' ', colon + 1));
      }
    }
  }
  return "unknown";
}

// at::show_config() lists build options, one of them "BLAS_INFO=<name>".
std::string blas_name() {
  const std::string config = at::show_config();
  const std::string key = "BLAS_INFO=";
  const auto pos = config.find(key);
  if (pos == std::string::npos) {
    return "unknown";
  }
  const auto start = pos + key.size();
  const auto end = config.find_first_of(", \n", start);
  return config.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

constexpr std::int64_t kMiB = std::int64_t{1024} * 1024;

std::string cuda_version_string(int v) {
  // CUDA encodes versions as 1000 * major + 10 * minor.
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

}  // namespace

Result<SystemInfo> query_system_info() {
  return guarded([] {
    SystemInfo info;
    info.host = host_name();
    info.os = os_string();
    info.cpu_model = cpu_model();
    info.hardware_threads = static_cast<int>(std::thread::hardware_concurrency());
    info.torch_threads = at::get_num_threads();
    info.libtorch_version = build_info().libtorch_version;
    info.blas = blas_name();
    info.mkldnn = at::hasMKLDNN();
    detail::probe_cuda(info);
    return info;
  });
}

void configure_threads(int threads) {
  if (threads <= 0) {
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }
  at::set_num_threads(threads);
}

std::string describe(const SystemInfo& info) {
  std::ostringstream out;
  out << "LibTorch " << info.libtorch_version << " (CPU BLAS: " << info.blas
      << ", oneDNN: " << (info.mkldnn ? "yes" : "no") << ")\n";
  out << "Host: " << info.host << ", " << info.os << "\n";
  out << "CPU: " << info.cpu_model << ", " << info.hardware_threads << " hardware threads, "
      << info.torch_threads << " LibTorch threads\n";
  if (!info.cuda_build) {
    out << "CUDA: not in this build (LibTorch without CUDA)";
    return out.str();
  }
  out << "CUDA: runtime " << cuda_version_string(info.cuda_runtime_version) << ", driver API "
      << (info.cuda_driver_version > 0 ? cuda_version_string(info.cuda_driver_version) : "none");
  if (!info.gpu_driver.empty()) {
    out << ", NVIDIA driver " << info.gpu_driver;
  }
  if (!info.cublas_version.empty()) {
    out << ", cuBLAS " << info.cublas_version;
  }
  if (!info.cudnn_version.empty()) {
    out << ", cuDNN " << info.cudnn_version;
  }
  if (info.gpus.empty()) {
    out << "\nGPUs: none visible";
  }
  for (const GpuInfo& gpu : info.gpus) {
    out << "\nGPU " << gpu.index << ": " << gpu.name << ", " << (gpu.total_memory / kMiB)
        << " MiB, compute " << gpu.compute_major << "." << gpu.compute_minor << ", "
        << gpu.multiprocessors << " SMs";
  }
  return out.str();
}

}  // namespace batchlens::base
