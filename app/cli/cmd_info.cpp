// SPDX-License-Identifier: Apache-2.0
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "app/cli/command.h"
#include "core/base/input.h"
#include "core/base/system_info.h"
#include "core/base/version.h"
#include "core/io/experiment_file.h"

namespace batchlens::cli {

std::string version_text() {
  const base::BuildInfo& b = base::build_info();
  std::string text = "BatchLens " + b.tool_version + " (git " + b.git_hash + ", " + b.build_type +
                     ", " + b.compiler + ")\n";
  const auto info = base::query_system_info();
  if (!info.ok()) {
    return text + "system query failed: " + info.error().message;
  }
  return text + base::describe(info.value());
}

namespace {

nlohmann::json to_json(const base::SystemInfo& s) {
  const base::BuildInfo& b = base::build_info();
  nlohmann::json gpus = nlohmann::json::array();
  for (const auto& g : s.gpus) {
    gpus.push_back({{"index", g.index},
                    {"name", g.name},
                    {"total_memory", g.total_memory},
                    {"compute_capability",
                     std::to_string(g.compute_major) + "." + std::to_string(g.compute_minor)},
                    {"multiprocessors", g.multiprocessors}});
  }
  return {{"batchlens",
           {{"version", b.tool_version},
            {"git", b.git_hash},
            {"build_type", b.build_type},
            {"compiler", b.compiler}}},
          {"libtorch", s.libtorch_version},
          // The experiment files this build writes: `remote` refuses a target that writes newer.
          {"file_schema", {io::kSchemaMajor, io::kSchemaMinor}},
          {"host", s.host},
          {"os", s.os},
          {"cpu",
           {{"model", s.cpu_model},
            {"hardware_threads", s.hardware_threads},
            {"torch_threads", s.torch_threads},
            {"blas", s.blas},
            {"onednn", s.mkldnn}}},
          {"cuda",
           {{"in_build", s.cuda_build},
            {"runtime", s.cuda_runtime_version},
            {"driver_api", s.cuda_driver_version},
            {"nvidia_driver", s.gpu_driver},
            {"cublas", s.cublas_version},
            {"cudnn", s.cudnn_version},
            {"gpus", gpus}}}};
}

}  // namespace

void register_info(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("info", "Print BatchLens, LibTorch and device information");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "Print as JSON");
  cmd->callback([json, &exit_code] {
    const auto info = base::query_system_info();
    if (!info.ok()) {
      std::cerr << "batchlens-cli: " << info.error().message << "\n";
      exit_code = kExitFailure;
      return;
    }
    if (*json) {
      std::cout << base::dump_json_lossy(to_json(info.value()), 2) << "\n";
    } else {
      std::cout << version_text() << "\n";
    }
    exit_code = kExitOk;
  });
}

}  // namespace batchlens::cli
