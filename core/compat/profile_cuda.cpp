// SPDX-License-Identifier: Apache-2.0
// Built when LibTorch has CUDA: torch::autograd::profiler (Kineto).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include "core/compat/profile.h"

#include <unistd.h>

namespace batchlens::compat {

bool profiler_available() {
  return true;
}

void profile_to_file(const std::string& path, const std::function<void()>& work) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const prof::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  const std::set<ActivityType> activities{ActivityType::CPU, ActivityType::CUDA};
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  try {
    work();
    // The kernels still queued when `work` returns would be missing from the trace: the
    // profiler stops collecting at disableProfiler (the 26B-A4B pass at B=4 lost its last
    // layers and lm_head that way: 6 of 30 on an H100, 10 on an H200).
    if (torch::cuda::is_available()) {
      torch::cuda::synchronize();
    }
  } catch (...) {
    (void)prof::disableProfiler();
    throw;
  }
  prof::disableProfiler()->save(path);
}

namespace {

std::array<std::int64_t, 3> dims(const nlohmann::json& args, const char* key) {
  std::array<std::int64_t, 3> d{0, 0, 0};
  const auto it = args.find(key);
  if (it != args.end() && it->is_array()) {
    for (std::size_t i = 0; i < 3 && i < it->size(); ++i) {
      if ((*it)[i].is_number_integer()) {
        d[i] = (*it)[i].get<std::int64_t>();
      }
    }
  }
  return d;
}

std::int64_t correlation(const nlohmann::json& e) {
  const auto args = e.find("args");
  if (args == e.end() || !args->is_object()) {
    return -1;
  }
  const auto c = args->find("correlation");
  return c != args->end() && c->is_number_integer() ? c->get<std::int64_t>() : -1;
}

std::string text(const nlohmann::json& e, const char* key) {
  const auto it = e.find(key);
  return it != e.end() && it->is_string() ? it->get<std::string>() : std::string();
}

double number(const nlohmann::json& e, const char* key) {
  const auto it = e.find(key);
  return it != e.end() && it->is_number() ? it->get<double>() : 0.0;
}

std::string thread_of(const nlohmann::json& e) {
  const auto tid = e.find("tid");
  return tid == e.end() ? std::string() : tid->dump();
}

}  // namespace

std::vector<DeviceKernel> profile_kernels(const std::function<void()>& work,
                                          const std::string& scope_prefix) {
  // Kineto writes its trace as JSON; that is the form that carries each kernel's grid and
  // block. It goes to a private temporary file, read back and removed here.
  static std::atomic<int> serial{0};
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("batchlens-kernels-" + std::to_string(::getpid()) +
                                                "-" + std::to_string(serial++) + ".json");
  profile_to_file(path.string(), work);
  nlohmann::json trace;
  {
    std::ifstream in(path);
    trace = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  }
  std::error_code ec;
  std::filesystem::remove(path, ec);
  TORCH_CHECK(trace.is_object() && trace.contains("traceEvents") && trace["traceEvents"].is_array(),
              "the profiler's trace could not be read back");
  // Scopes per thread, the launching runtime call of each correlation id, then the kernels.
  struct Scope {
    double begin;
    double end;
    std::string name;
  };
  std::map<std::string, std::vector<Scope>> scopes;
  std::map<std::int64_t, std::pair<std::string, double>> launches;  // correlation -> (tid, ts)
  std::vector<const nlohmann::json*> kernels;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (!e.is_object()) {
      continue;
    }
    const std::string cat = text(e, "cat");
    if (cat == "user_annotation") {
      const std::string name = text(e, "name");
      if (name.rfind(scope_prefix, 0) == 0) {
        const double ts = number(e, "ts");
        scopes[thread_of(e)].push_back(Scope{ts, ts + number(e, "dur"), name});
      }
    } else if (cat == "cuda_runtime" || cat == "cuda_driver") {
      const std::int64_t c = correlation(e);
      if (c >= 0) {
        launches[c] = {thread_of(e), number(e, "ts")};
      }
    } else if (cat == "kernel") {
      kernels.push_back(&e);
    }
  }
  std::sort(kernels.begin(), kernels.end(), [](const nlohmann::json* a, const nlohmann::json* b) {
    return number(*a, "ts") < number(*b, "ts");
  });
  std::vector<DeviceKernel> out;
  out.reserve(kernels.size());
  for (const nlohmann::json* k : kernels) {
    DeviceKernel d;
    d.name = text(*k, "name");
    d.duration_us = number(*k, "dur");
    d.start_us = number(*k, "ts");
    const auto args = k->find("args");
    if (args != k->end() && args->is_object()) {
      d.grid = dims(*args, "grid");
      d.block = dims(*args, "block");
      const auto stream = args->find("stream");
      if (stream != args->end() && stream->is_number_integer()) {
        d.stream = stream->get<std::int64_t>();
      }
    }
    const auto launch = launches.find(correlation(*k));
    if (launch != launches.end()) {
      // The innermost (shortest) scope of that thread that contains the launch.
      double best = -1.0;
      for (const Scope& s : scopes[launch->second.first]) {
        const double ts = launch->second.second;
        if (s.begin <= ts && ts <= s.end && (best < 0 || s.end - s.begin < best)) {
          best = s.end - s.begin;
          d.scope = s.name;
        }
      }
    }
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace batchlens::compat
