// SPDX-License-Identifier: Apache-2.0
#include "core/base/switches.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "core/base/named.h"

namespace batchlens::base {

const char* bi_plan_name(BiPlan plan) {
  switch (plan) {
    case BiPlan::Timed:
      return "timed";
    case BiPlan::Fixed:
      return "fixed";
    case BiPlan::Classes:
      break;
  }
  return "classes";
}

Result<BiPlan> parse_bi_plan(std::string_view name) {
  return parse_named(name, {BiPlan::Classes, BiPlan::Timed, BiPlan::Fixed}, bi_plan_name,
                     "batch-invariant GEMM plan");
}

bool Switches::fused_kernel(std::string_view name) const {
  return fused && std::find(fused_off.begin(), fused_off.end(), name) == fused_off.end();
}

bool Switches::kv_room() const {
  return std::find(fused_off.begin(), fused_off.end(), "room") == fused_off.end();
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
  if (bi_plan != BiPlan::Classes) {
    add(std::string("BATCHLENS_BI_PLAN=") + bi_plan_name(bi_plan));
  }
  if (side_branches) {
    add("BATCHLENS_SIDE_BRANCHES=1");
  }
  if (expert_wgmma) {
    add("BATCHLENS_EXPERT_WGMMA=1");
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
  const char* branches = std::getenv("BATCHLENS_SIDE_BRANCHES");
  const char* wgmma = std::getenv("BATCHLENS_EXPERT_WGMMA");
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
  s.side_branches = branches != nullptr && std::string_view(branches) == "1";
  s.expert_wgmma = wgmma != nullptr && std::string_view(wgmma) == "1";
  // Any other value keeps the default, as for the other switches.
  if (bi_plan != nullptr) {
    if (auto plan = parse_bi_plan(bi_plan); plan.ok()) {
      s.bi_plan = plan.value();
    }
  }
  return s;
}

}  // namespace batchlens::base
