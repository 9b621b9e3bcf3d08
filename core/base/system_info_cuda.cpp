// SPDX-License-Identifier: Apache-2.0
// Built when LibTorch has CUDA (the PyTorch wheel's LibTorch on GPU servers).
#include <cctype>
#include <fstream>
#include <sstream>
#include <string>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "core/base/system_info.h"

namespace batchlens::base::detail {

namespace {

std::string read_nvidia_driver_version() {
  // "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ..."
  // (wording varies): the first token after "Kernel Module" that starts with a digit.
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  if (!std::getline(in, line)) {
    return {};
  }
  const auto key = line.find("Kernel Module");
  if (key == std::string::npos) {
    return {};
  }
  std::istringstream tokens(line.substr(key));
  std::string token;
  while (tokens >> token) {
    if (std::isdigit(static_cast<unsigned char>(token[0])) != 0 &&
        token.find('.') != std::string::npos) {
      return token;
    }
  }
  return {};
}

}  // namespace

void probe_cuda(SystemInfo& info) {
  info.cuda_build = true;
  int driver = 0;
  if (cudaDriverGetVersion(&driver) == cudaSuccess) {
    info.cuda_driver_version = driver;
  }
  int runtime = 0;
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) {
    info.cuda_runtime_version = runtime;
  }
  info.gpu_driver = read_nvidia_driver_version();
  const int count = static_cast<int>(c10::cuda::device_count());
  for (int i = 0; i < count; ++i) {
    const cudaDeviceProp* prop = at::cuda::getDeviceProperties(i);
    GpuInfo gpu;
    gpu.index = i;
    gpu.name = prop->name;
    gpu.total_memory = static_cast<std::int64_t>(prop->totalGlobalMem);
    gpu.compute_major = prop->major;
    gpu.compute_minor = prop->minor;
    gpu.multiprocessors = prop->multiProcessorCount;
    info.gpus.push_back(gpu);
  }
  int major = 0;
  int minor = 0;
  int patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS) {
    info.cublas_version =
        std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  }
  const auto& hooks = at::detail::getCUDAHooks();
  if (hooks.hasCuDNN()) {
    // cuDNN 9 encodes its version as major * 10000 + minor * 100 + patch.
    const long v = hooks.versionCuDNN();
    info.cudnn_version = std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." +
                         std::to_string(v % 100);
  }
}

}  // namespace batchlens::base::detail
