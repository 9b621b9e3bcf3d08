// SPDX-License-Identifier: Apache-2.0
#include "core/setup/policy_cost.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <memory>
#include <set>
#include <thread>

#include <ATen/ATen.h>

#include "core/model/diffusion_gemma.h"
#include "core/ops/op_observer.h"
#include "core/ops/op_profile.h"
#include "core/setup/engine_pass.h"

namespace batchlens::setup {

using model::DiffusionGemma;

namespace {

// The 1-minute load average (/proc/loadavg), -1 where there is none.
double load_average() {
  std::ifstream in("/proc/loadavg");
  double load = -1;
  if (!(in >> load)) {
    return -1;
  }
  return load;
}

// Nearest-rank quantile of sorted times.
double quantile(const std::vector<double>& sorted, double q) {
  const auto last = static_cast<double>(sorted.size() - 1);
  return sorted[static_cast<std::size_t>(std::lround(q * last))];
}

PolicyCostCell cell_of(std::vector<double> times, std::string mode) {
  std::sort(times.begin(), times.end());
  PolicyCostCell c;
  c.min_ms = times.front();
  c.q1_ms = quantile(times, 0.25);
  c.median_ms = quantile(times, 0.5);
  c.q3_ms = quantile(times, 0.75);
  c.mode = std::move(mode);
  return c;
}

// Asks the op layer to mark every call for the profiler; hears nothing else.
// Asks the op layer to mark every call for the profiler, and keeps which ops were called (the
// scopes a complete profile has kernels in).
class MarkEveryOp final : public ops::OpObserver {
 public:
  void on_op(const ops::OpCall& call) override {
    called.insert("bl/" + std::string(ops::family_name(call.family)) + "/" +
                  std::to_string(call.layer));
  }
  bool marks() const override { return true; }
  std::set<std::string> called;
};

// One eager decoder pass under the profiler, its kernels grouped (after a warm-up pass, so that
// library handles and heuristics are made outside the trace).
PassProfile profile_pass(const DiffusionGemma& model, const EngineInputs& in,
                         const model::KvCache& cache, const ops::OpPolicy& policy) {
  MarkEveryOp marker;
  model::ForwardContext ctx{&policy, nullptr, false};
  (void)model.decode(in.canvas, cache, in.sc, ctx);
  ctx.observer = &marker;
  const std::vector<ops::KernelSeen> seen =
      ops::profile_marked_kernels([&] { (void)model.decode(in.canvas, cache, in.sc, ctx); });
  PassProfile out;
  std::set<std::string> with_kernels;
  std::vector<KernelGroup> families;
  std::vector<KernelGroup> outside;
  std::vector<KernelGroup> by_name;
  const auto add = [](std::vector<KernelGroup>& groups, const std::string& name, bool op_layer,
                      double us) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const KernelGroup& g) { return g.name == name; });
    if (it == groups.end()) {
      groups.push_back(KernelGroup{name, op_layer, 0, 0.0});
      it = groups.end() - 1;
    }
    ++it->kernels;
    it->total_us += us;
  };
  for (const ops::KernelSeen& k : seen) {
    out.kernel_ms += k.duration_us / 1000.0;
    // "bl/<family>/<layer>"
    const std::size_t slash = k.scope.rfind('/');
    if (k.scope.rfind("bl/", 0) == 0 && slash > 3) {
      add(families, k.scope.substr(3, slash - 3), true, k.duration_us);
      with_kernels.insert(k.scope);
      continue;
    }
    add(outside, kernel_kind(k.name), false, k.duration_us);
    add(by_name, short_kernel_name(k.name), false, k.duration_us);
  }
  // Families in enum order, the other kinds by time.
  for (const ops::OpFamily f : ops::all_families()) {
    for (const KernelGroup& g : families) {
      if (g.name == ops::family_name(f)) {
        out.groups.push_back(g);
      }
    }
  }
  const auto longest_first = [](const KernelGroup& a, const KernelGroup& b) {
    return a.total_us > b.total_us;
  };
  std::sort(outside.begin(), outside.end(), longest_first);
  out.groups.insert(out.groups.end(), outside.begin(), outside.end());
  std::sort(by_name.begin(), by_name.end(), longest_first);
  constexpr std::size_t kTopOutside = 12;
  by_name.resize(std::min(by_name.size(), kTopOutside));
  out.top_outside = std::move(by_name);
  // Every op call launches kernels: one without any in the trace means the profiler dropped
  // records (the 26B-A4B pass at B=4 and above lost some on an H100).
  for (const std::string& scope : marker.called) {
    out.ops_without_kernels += with_kernels.count(scope) == 0 ? 1 : 0;
  }
  out.op_calls = static_cast<int>(marker.called.size());
  return out;
}

}  // namespace

std::string short_kernel_name(std::string name) {
  for (const std::string cut : {"(anonymous namespace)::", "void ", "at::native::", "at::cuda::",
                                "batchlens::kernels::cuda::", "c10::"}) {
    for (std::size_t at = name.find(cut); at != std::string::npos; at = name.find(cut)) {
      name.erase(at, cut.size());
    }
  }
  // Up to the parameter list: the '(' outside the template arguments, which stay (ATen's
  // elementwise and reduce kernels are one name for every functor: a copy, a cast, a sum).
  int depth = 0;
  for (std::size_t i = 0; i < name.size(); ++i) {
    depth += name[i] == '<' ? 1 : (name[i] == '>' ? -1 : 0);
    if (name[i] == '(' && depth == 0) {
      return name.substr(0, i);
    }
  }
  return name;
}

std::string kernel_kind(const std::string& kernel_name) {
  // Lower case, then the first rule whose word the name contains.
  std::string name = kernel_name;
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  static const std::vector<std::pair<std::vector<const char*>, const char*>> rules = {
      {{"norm_kernel", "square_kernel", "mean_sq", "inverse_kernel", "rms", "norm"},
       "RMSNorm (+RoPE)"},
      {{"combine_kernel"}, "expert combine"},
      {{"route_kernel", "sort", "topk", "radix", "scan", "histogram", "histc", "cumsum", "index",
        "gather", "scatter"},
       "routing (sort, top-k, gather, scatter)"},
      {{"gelu"}, "GELU x up"},
      {{"softcap", "tanh"}, "soft-cap"},
      {{"softmax"}, "softmax"},
      {{"memcpy", "memset", "copy"}, "copies"},
      {{"reduce"}, "reductions (ATen)"},
      {{"elementwise", "vectorized", "unrolled"}, "elementwise (ATen)"},
  };
  for (const auto& [words, kind] : rules) {
    for (const char* w : words) {
      if (name.find(w) != std::string::npos) {
        return kind;
      }
    }
  }
  return "other";
}

base::Result<PolicyCosts> measure_policy_costs(const DiffusionGemma& model,
                                               const PolicyCostRequest& request) {
  return base::guarded([&] {
    if (request.policies.empty() || request.batch_sizes.empty() || request.repeat <= 0) {
      base::raise(base::ErrorCode::InvalidArgument,
                  "policy costs: give at least one policy, one batch size and repeat > 0");
    }
    for (const std::int64_t b : request.batch_sizes) {
      if (b <= 0 || b > 4096) {
        base::raise(base::ErrorCode::InvalidArgument,
                    "policy costs: batch size " + std::to_string(b) + " is outside 1..4096");
      }
    }
    PolicyCosts out;
    out.batch_sizes = request.batch_sizes;
    out.repeat = request.repeat;
    out.fused_report = model.fused_kernels().report;
    out.cpu = model.device().is_cpu();
    out.cores = static_cast<int>(std::thread::hardware_concurrency());
    out.load_before = load_average();
    bool invariant = false;
    for (const auto& [label, policy] : request.policies) {
      out.labels.push_back(label);
      out.policies.push_back(ops::policy_text(policy));
      invariant = invariant || ops::families_with(policy, ops::Strategy::BatchInvariant).any();
    }
    if (invariant) {
      out.invariance_report = model.batch_invariance().report;
    }
    const bool profiling =
        request.profile && model.device().is_cuda() && ops::kernel_profiler_available();
    if (request.profile && !profiling) {
      out.profile_note = model.device().is_cuda()
                             ? "no profile: this LibTorch cannot see device kernels"
                             : "no profile: profiles are of device kernels, and this model runs "
                               "on " +
                                   model.device().str();
    }
    const std::size_t policies = request.policies.size();
    const int total = static_cast<int>(policies * request.batch_sizes.size());
    int done = 0;
    out.cells.assign(policies, {});
    for (const std::int64_t b : request.batch_sizes) {
      // The blocks of the last batch size's passes and graphs, back to the device before this
      // one's captures (B=32 on the 26B-A4B architecture did not fit an H100 without).
      release_cached_device_memory(model.device());
      const EngineInputs in =
          random_engine_inputs(model, b, request.prompt_length, request.input_seed,
                               /*self_conditioning=*/true);
      // Each policy's cache (the prompt encoded under it) and prepared pass, all alive at once.
      std::vector<std::unique_ptr<model::KvCache>> caches;
      std::vector<std::unique_ptr<EnginePass>> passes;
      for (const auto& [label, policy] : request.policies) {
        try {
          caches.push_back(std::make_unique<model::KvCache>());
          model.encode(in.ids.clone(), *caches.back(), model::ForwardContext{&policy, nullptr});
          passes.push_back(
              std::make_unique<EnginePass>(model, in.canvas, *caches.back(), in.sc, policy));
        } catch (...) {
          const base::Error e = base::error_from_current_exception();
          base::raise(e.code, label + " at B=" + std::to_string(b) + ": " + e.message);
        }
      }
      // Interleaved: round r starts at policy r mod P, so each policy takes every position in
      // turn and a change of load or clock falls on all of them alike.
      std::vector<std::vector<double>> times(policies);
      for (int r = 0; r < request.repeat; ++r) {
        for (std::size_t k = 0; k < policies; ++k) {
          const std::size_t p = (static_cast<std::size_t>(r) + k) % policies;
          times[p].push_back(passes[p]->time_ms());
        }
      }
      for (std::size_t p = 0; p < policies; ++p) {
        out.cells[p].push_back(cell_of(std::move(times[p]), passes[p]->mode()));
        if (profiling) {
          out.cells[p].back().profile =
              profile_pass(model, in, *caches[p], request.policies[p].second);
        }
      }
      const PolicyCostCell& base_cell = out.cells[0].back();
      for (std::size_t p = 1; p < policies; ++p) {
        PolicyCostCell& c = out.cells[p].back();
        c.within_noise = c.q1_ms <= base_cell.q3_ms && base_cell.q1_ms <= c.q3_ms;
      }
      done += static_cast<int>(policies);
      if (request.progress && !request.progress(done, total)) {
        base::raise(base::ErrorCode::Cancelled, "policy costs cancelled");
      }
    }
    out.load_after = load_average();
    return out;
  });
}

}  // namespace batchlens::setup
