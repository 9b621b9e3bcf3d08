// SPDX-License-Identifier: Apache-2.0
#include "core/setup/policy_cost.h"

#include <cmath>
#include <fstream>
#include <memory>
#include <thread>

#include <ATen/ATen.h>

#include "core/model/diffusion_gemma.h"
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

}  // namespace

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
    const std::size_t policies = request.policies.size();
    const int total = static_cast<int>(policies * request.batch_sizes.size());
    int done = 0;
    out.cells.assign(policies, {});
    for (const std::int64_t b : request.batch_sizes) {
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
