// SPDX-License-Identifier: Apache-2.0
#include "core/setup/policy_cost.h"

#include "core/model/diffusion_gemma.h"
#include "core/setup/forward_file.h"

namespace batchlens::setup {

using model::DiffusionGemma;

base::Result<PolicyCosts> measure_policy_costs(const DiffusionGemma& model,
                                               const PolicyCostRequest& request) {
  return base::guarded([&] {
    if (request.policies.empty() || request.batch_sizes.empty() || request.repeat <= 0) {
      base::raise(base::ErrorCode::InvalidArgument,
                  "policy costs: give at least one policy, one batch size and repeat > 0");
    }
    PolicyCosts out;
    out.batch_sizes = request.batch_sizes;
    out.repeat = request.repeat;
    out.fused_report = model.fused_kernels().report;
    bool invariant = false;
    for (const auto& [label, policy] : request.policies) {
      out.labels.push_back(label);
      out.policies.push_back(ops::policy_text(policy));
      invariant = invariant || ops::families_with(policy, ops::Strategy::BatchInvariant).any();
    }
    if (invariant) {
      out.invariance_report = model.batch_invariance().report;
    }
    const int total = static_cast<int>(request.policies.size() * request.batch_sizes.size());
    int done = 0;
    out.cells.assign(request.policies.size(), {});
    // Batch size by batch size, every policy in turn: the policies of one batch size are timed
    // next to each other, so a change of machine load falls on all of them.
    for (const std::int64_t b : request.batch_sizes) {
      for (std::size_t pi = 0; pi < request.policies.size(); ++pi) {
        const auto& [label, policy] = request.policies[pi];
        if (b <= 0 || b > 4096) {
          base::raise(base::ErrorCode::InvalidArgument,
                      "policy costs: batch size " + std::to_string(b) + " is outside 1..4096");
        }
        ForwardRequest req;
        req.rows = b;
        req.repeat = request.repeat;
        req.self_conditioning = true;
        req.engine_timing = true;
        req.prompt_length = request.prompt_length;
        req.input_seed = request.input_seed;
        req.policy = policy;
        auto summary = run_forward_file(model, req);
        if (!summary.ok()) {
          base::raise(summary.error().code,
                      label + " at B=" + std::to_string(b) + ": " + summary.error().message);
        }
        out.cells[pi].push_back(PolicyCostCell{summary.value().engine_median_ms,
                                               summary.value().engine_min_ms,
                                               summary.value().engine_mode});
        if (request.progress && !request.progress(++done, total)) {
          base::raise(base::ErrorCode::Cancelled, "policy costs cancelled");
        }
      }
    }
    return out;
  });
}

}  // namespace batchlens::setup
