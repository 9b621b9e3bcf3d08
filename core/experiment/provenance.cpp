// SPDX-License-Identifier: Apache-2.0
#include "core/experiment/provenance.h"

#include <ctime>

#include "core/base/system_info.h"
#include "core/base/version.h"

namespace batchlens::experiment {

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Provenance provenance_now(const model::LoadOptions& load, bool emulated) {
  Provenance p;
  const auto& build = base::build_info();
  p.tool_version = build.tool_version + " (" + build.git_hash + ")";
  p.created_utc = utc_now();
  p.device = load.device;
  p.dtype = load.dtype;
  p.emulated = emulated;
  auto info = base::query_system_info();
  if (!info.ok()) {
    return p;
  }
  const base::SystemInfo& i = info.value();
  p.host = i.host;
  p.libtorch = i.libtorch_version;
  p.threads = i.torch_threads;
  p.blas = i.blas + (i.mkldnn ? " + oneDNN" : "");
  p.device_name = i.cpu_model;
  p.cpu = i.cpu_isa;
  if (load.device.rfind("cuda", 0) == 0 && !i.gpus.empty()) {
    const auto colon = load.device.find(':');
    const std::size_t index =
        colon == std::string::npos ? 0 : std::stoul(load.device.substr(colon + 1));
    p.device_name = index < i.gpus.size() ? i.gpus[index].name : i.gpus.front().name;
    p.driver = i.gpu_driver;
    p.cuda = std::to_string(i.cuda_runtime_version / 1000) + "." +
             std::to_string((i.cuda_runtime_version % 1000) / 10);
    p.cublas = i.cublas_version;
  }
  return p;
}

}  // namespace batchlens::experiment
