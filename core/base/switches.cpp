// SPDX-License-Identifier: Apache-2.0
#include "core/base/switches.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

namespace batchlens::base {

bool Switches::fused_kernel(std::string_view name) const {
  return fused && std::find(fused_off.begin(), fused_off.end(), name) == fused_off.end();
}

std::string Switches::describe() const {
  std::string out;
  const auto add = [&out](const std::string& part) {
    out += (out.empty() ? "" : "; ") + part;
  };
  if (!fused) {
    add("BATCHLENS_FUSED=0");
  }
  if (!fused_off.empty()) {
    std::string list;
    for (const auto& name : fused_off) {
      list += (list.empty() ? "" : ",") + name;
    }
    add("BATCHLENS_FUSED_OFF=" + list);
  }
  if (!cuda_graphs) {
    add("BATCHLENS_CUDA_GRAPHS=0");
  }
  if (!thread_choice) {
    add("BATCHLENS_THREAD_CHOICE=0");
  }
  if (!bi_plan_timed) {
    add("BATCHLENS_BI_PLAN=fixed");
  }
  return out;
}

Switches Switches::from_environment() {
  // NOLINTBEGIN(concurrency-mt-unsafe): read at the program's edge, before any run starts.
  const char* fused = std::getenv("BATCHLENS_FUSED");
  const char* off = std::getenv("BATCHLENS_FUSED_OFF");
  const char* graphs = std::getenv("BATCHLENS_CUDA_GRAPHS");
  const char* threads = std::getenv("BATCHLENS_THREAD_CHOICE");
  const char* bi_plan = std::getenv("BATCHLENS_BI_PLAN");
  // NOLINTEND(concurrency-mt-unsafe)
  Switches s;
  s.fused = !(fused != nullptr && std::string_view(fused) == "0");
  if (off != nullptr) {
    std::stringstream list(off);
    for (std::string name; std::getline(list, name, ',');) {
      if (!name.empty()) {
        s.fused_off.push_back(name);
      }
    }
  }
  s.cuda_graphs = !(graphs != nullptr && std::string_view(graphs) == "0");
  s.thread_choice = !(threads != nullptr && std::string_view(threads) == "0");
  s.bi_plan_timed = !(bi_plan != nullptr && std::string_view(bi_plan) == "fixed");
  return s;
}

}  // namespace batchlens::base
