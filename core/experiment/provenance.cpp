// SPDX-License-Identifier: Apache-2.0
#include "core/experiment/provenance.h"

#include <ctime>

#include <nlohmann/json.hpp>

#include "core/base/json_field.h"
#include "core/base/version.h"

namespace batchlens::experiment {

namespace {

// "oneDNN" of "oneDNN (BatchLens's CPU GEMM, checked bitwise at load)": BatchLens's GEMM is
// checked at load to give the bits of the kernel it stands in for.
std::string kernel_of(const std::string& bf16_matmul) {
  return bf16_matmul.substr(0, bf16_matmul.find(" ("));
}

// `what` as the phrase of one difference: "LibTorch 2.11.0 there, 1.13.0 here".
void differs(std::vector<std::string>& out, const std::string& what, const std::string& there,
             const std::string& here) {
  if (there != here) {
    const auto shown = [](const std::string& s) {
      return s.empty() ? std::string("?") : s;
    };
    out.push_back(what + " " + shown(there) + " there, " + shown(here) + " here");
  }
}

}  // namespace

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Provenance provenance_of(const base::SystemInfo& system, const model::LoadOptions& load,
                         bool emulated) {
  Provenance p;
  const auto& build = base::build_info();
  p.tool_version = build.tool_version + " (" + build.git_hash + ")";
  p.created_utc = utc_now();
  p.device = load.device;
  p.dtype = load.dtype;
  p.emulated = emulated;
  p.host = system.host;
  p.libtorch = system.libtorch_version;
  p.threads = system.torch_threads;
  p.blas = system.blas + (system.mkldnn ? " + oneDNN" : "");
  p.device_name = system.cpu_model;
  p.cpu = system.cpu_isa;
  if (load.device.rfind("cuda", 0) == 0 && !system.gpus.empty()) {
    // "cuda" is device 0; a malformed index (a damaged file's spec) names the first GPU.
    const auto colon = load.device.find(':');
    std::size_t index = 0;
    if (colon != std::string::npos) {
      const std::string digits = load.device.substr(colon + 1);
      index = !digits.empty() && digits.size() < 6 &&
                      digits.find_first_not_of("0123456789") == std::string::npos
                  ? std::stoul(digits)
                  : system.gpus.size();
    }
    p.device_name = index < system.gpus.size() ? system.gpus[index].name : system.gpus.front().name;
    p.driver = system.gpu_driver;
    p.cuda = std::to_string(system.cuda_runtime_version / 1000) + "." +
             std::to_string((system.cuda_runtime_version % 1000) / 10);
    p.cublas = system.cublas_version;
  }
  return p;
}

Provenance provenance_now(const model::LoadOptions& load, bool emulated) {
  auto info = base::query_system_info();
  return provenance_of(info.ok() ? info.value() : base::SystemInfo{}, load, emulated);
}

std::vector<std::string> provenance_mismatches(const Provenance& shown, const Provenance& here) {
  std::vector<std::string> out;
  differs(out, "device", shown.device, here.device);
  differs(out, "dtype", shown.dtype, here.dtype);
  differs(out, "LibTorch", shown.libtorch, here.libtorch);
  if (shown.device.rfind("cuda", 0) == 0) {
    differs(out, "GPU", shown.device_name, here.device_name);
    differs(out, "CUDA", shown.cuda, here.cuda);
    differs(out, "cuBLAS", shown.cublas, here.cublas);
  } else if (shown.device == here.device) {
    const base::CpuIsa& a = shown.cpu;
    const base::CpuIsa& b = here.cpu;
    if (a.aten_capability.empty() && a.bf16_matmul.empty()) {
      out.emplace_back("CPU kernels not recorded there (a file before schema 1.3)");
    } else {
      differs(out, "ATen CPU kernels", a.aten_capability, b.aten_capability);
      differs(out, "oneDNN ISA", a.onednn_isa, b.onednn_isa);
      differs(out, "bf16 matmuls by", kernel_of(a.bf16_matmul), kernel_of(b.bf16_matmul));
    }
  }
  return out;
}

nlohmann::json provenance_to_json(const Provenance& p) {
  return {{"host", p.host},         {"device", p.device},     {"device_name", p.device_name},
          {"driver", p.driver},     {"cuda", p.cuda},         {"cublas", p.cublas},
          {"libtorch", p.libtorch}, {"tool", p.tool_version}, {"dtype", p.dtype}};
}

base::Result<Provenance> provenance_from_json(const nlohmann::json& doc) {
  return base::guarded([&] {
    const std::string where = "provenance";
    if (!doc.is_object()) {
      base::raise(base::ErrorCode::FileCorrupted, where + " is not an object");
    }
    Provenance p;
    p.host = base::json_field<std::string>(doc, "host", where);
    p.device = base::json_field<std::string>(doc, "device", where);
    p.device_name = base::json_field<std::string>(doc, "device_name", where);
    p.driver = base::json_field<std::string>(doc, "driver", where);
    p.cuda = base::json_field<std::string>(doc, "cuda", where);
    p.cublas = base::json_field<std::string>(doc, "cublas", where);
    p.libtorch = base::json_field<std::string>(doc, "libtorch", where);
    p.tool_version = base::json_field<std::string>(doc, "tool", where);
    p.dtype = base::json_field<std::string>(doc, "dtype", where);
    return p;
  });
}

}  // namespace batchlens::experiment
