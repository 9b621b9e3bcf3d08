// SPDX-License-Identifier: Apache-2.0
#include "core/base/system_info.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>

#include "core/base/version.h"

#include <dlfcn.h>
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

// The "flags" line of /proc/cpuinfo as a set of words (x86: the cpuid feature bits).
std::vector<std::string> cpu_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) {
      const auto colon = line.find(':');
      std::istringstream words(colon == std::string::npos ? std::string() : line.substr(colon + 1));
      std::vector<std::string> out;
      std::string w;
      while (words >> w) {
        out.push_back(w);
      }
      return out;
    }
  }
  return {};
}

// Reads an environment variable at the program's edge ("" when unset).
std::string env(const char* name) {
  const char* v = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): read-only use
  return v != nullptr ? std::string(v) : std::string();
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// oneDNN's dnnl_cpu_isa_t values (oneDNN 2.x/3.x, dnnl_types.h) and their names.
std::string onednn_isa_name(unsigned value) {
  static constexpr std::array<std::pair<unsigned, const char*>, 12> kNames{{
      {0x0U, "all"},
      {0x1U, "sse41"},
      {0x3U, "avx"},
      {0x7U, "avx2"},
      {0x407U, "avx2_vnni"},
      {0xc07U, "avx2_vnni_2"},
      {0x27U, "avx512_core"},
      {0x67U, "avx512_core_vnni"},
      {0xe7U, "avx512_core_bf16"},
      {0x1e7U, "avx512_core_fp16"},
      {0x3e7U, "avx512_core_amx"},
      {0x7e7U, "avx512_core_amx_fp16"},
  }};
  for (const auto& [v, name] : kNames) {
    if (v == value) {
      return name;
    }
  }
  std::ostringstream out;
  out << "0x" << std::hex << value;
  return out.str();
}

// The ISA oneDNN uses, asked through its C API when the process has it (LibTorch's oneDNN as a
// shared library, as in Debian's LibTorch 1.13); "" when it cannot be asked.
std::string onednn_isa() {
  using Fn = int (*)();
  void* sym = dlsym(RTLD_DEFAULT, "dnnl_get_effective_cpu_isa");
  if (sym == nullptr) {
    return "";
  }
  Fn fn = nullptr;
  static_assert(sizeof(fn) == sizeof(sym));
  std::memcpy(&fn, &sym, sizeof(fn));
  return onednn_isa_name(static_cast<unsigned>(fn()));
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

CpuIsa query_cpu_isa() {
  CpuIsa isa;
  const std::vector<std::string> flags = cpu_flags();
  const auto has = [&](const char* f) {
    return std::find(flags.begin(), flags.end(), f) != flags.end();
  };
  static constexpr std::array<const char*, 16> kListed{
      "sse4_2",      "avx",      "avx2",     "fma",      "avx_vnni",    "avx512f",
      "avx512cd",    "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16",
      "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8"};
  for (const char* f : kListed) {
    if (has(f)) {
      isa.flags += (isa.flags.empty() ? "" : " ") + std::string(f);
    }
  }
  // ATen 1.13 (DispatchStub.cpp compute_cpu_capability): the environment's level if the CPU has
  // it, else AVX512 with AVX-512 VL/BW/DQ and FMA, else AVX2 with AVX2, else DEFAULT.
  const bool avx512 = has("avx512vl") && has("avx512bw") && has("avx512dq") && has("fma");
  const bool avx2 = has("avx2");
  const std::string want = lower(env("ATEN_CPU_CAPABILITY"));
  if (want == "default") {
    isa.aten_capability = "DEFAULT";
  } else if (want == "avx2" && avx2) {
    isa.aten_capability = "AVX2";
  } else if (want == "avx512" && avx512) {
    isa.aten_capability = "AVX512";
  } else {
    isa.aten_capability = avx512 ? "AVX512" : (avx2 ? "AVX2" : "DEFAULT");
  }
  if (flags.empty()) {
    isa.aten_capability.clear();  // not an x86 /proc/cpuinfo: nothing known
  }
  isa.onednn_isa = onednn_isa();
  // ATen 1.13 sends bf16 matmuls to oneDNN when it is on and the CPU has AVX-512 BW/VL/DQ
  // (mkldnn_bf16_device_check); BatchLens turns it off where oneDNN refuses them.
  const bool onednn_bf16 = at::hasMKLDNN() && at::globalContext().userEnabledMkldnn() &&
                           has("avx512bw") && has("avx512vl") && has("avx512dq");
  isa.bf16_matmul = onednn_bf16 ? "oneDNN" : "ATen";
  for (const char* name : {"ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"}) {
    const std::string v = env(name);
    if (!v.empty()) {
      isa.caps += (isa.caps.empty() ? "" : " ") + std::string(name) + "=" + v;
    }
  }
  return isa;
}

std::string describe(const CpuIsa& isa) {
  std::ostringstream out;
  out << (isa.flags.empty() ? std::string("unknown ISA") : isa.flags) << "; ATen "
      << (isa.aten_capability.empty() ? std::string("?") : isa.aten_capability) << ", oneDNN "
      << (isa.onednn_isa.empty() ? std::string("?") : isa.onednn_isa) << ", bf16 matmul "
      << isa.bf16_matmul;
  if (!isa.caps.empty()) {
    out << " (" << isa.caps << ")";
  }
  return out.str();
}

Result<SystemInfo> query_system_info() {
  return guarded([] {
    SystemInfo info;
    info.host = host_name();
    info.os = os_string();
    info.cpu_model = cpu_model();
    info.cpu_isa = query_cpu_isa();
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
  out << "CPU ISA: " << describe(info.cpu_isa) << "\n";
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

double seconds_since_process_start() {
  std::ifstream in("/proc/self/stat");
  std::string stat;
  std::getline(in, stat);
  // The command name (field 2) is in parentheses and may hold spaces: count after its ')'.
  const std::size_t close = stat.rfind(')');
  const long ticks = sysconf(_SC_CLK_TCK);
  timespec now{};
  if (close == std::string::npos || ticks <= 0 || clock_gettime(CLOCK_BOOTTIME, &now) != 0) {
    return -1.0;
  }
  std::istringstream rest(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i) {  // field 3 is the state, field 22 the start time in ticks
    if (!(rest >> field)) {
      return -1.0;
    }
  }
  char* end = nullptr;
  const unsigned long long start = std::strtoull(field.c_str(), &end, 10);
  if (end == field.c_str() || *end != '\0') {
    return -1.0;
  }
  const double now_s = static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
  return now_s - static_cast<double>(start) / static_cast<double>(ticks);
}

}  // namespace batchlens::base
