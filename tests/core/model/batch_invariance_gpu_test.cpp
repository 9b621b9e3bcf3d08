// SPDX-License-Identifier: Apache-2.0
// GPU tests (label gpu) of the batch-invariant strategy and the culprit finder on the H200: run
// by scripts/gpu-build.sh --gpu-tests, never in CI (issue #17).
#include <iostream>
#include <string>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "core/analysis/culprit.h"
#include "core/experiment/runner.h"
#include "core/kernels/fused_ops.h"
#include "core/model/diffusion_gemma.h"
#include "core/setup/forward_file.h"
#include "core/setup/front_door.h"

namespace batchlens {
namespace {

model::LoadOptions cuda_load() {
  model::LoadOptions o;
  o.device = "cuda";
  o.dtype = "bf16";
  o.experts = "grouped_mm";
  return o;
}

ops::FamilySet families(const ops::OpPolicy& policy) {
  ops::FamilySet f;
  for (const ops::PolicyRule& rule : policy.rules) {
    f |= rule.families;
  }
  return f;
}

// The load-time check at the 26B-A4B architecture's real shapes: every family's batch-invariant
// kernel keeps row 0 bitwise equal for B = 1..64.
TEST(BatchInvarianceGpu, EveryFamilyIsProvenAtTheRealShapesForB1To64) {
  ASSERT_TRUE(at::hasCUDA()) << "gpu tests need a CUDA device";
  model::ModelSource source;
  source.preset = "26b-a4b";
  auto session = setup::open_model(source, cuda_load());
  ASSERT_TRUE(session.ok()) << session.error().message;
  const model::BatchInvariance& bi = session.value().model->batch_invariance();
  std::cout << bi.report << "\n";
  ASSERT_EQ(bi.batch_sizes.size(), 64U);
  EXPECT_EQ(bi.batch_sizes.back(), 64);
  EXPECT_TRUE(bi.proven.all()) << bi.report;
  // The pinned algorithms are reported, the self-conditioning matmul's K split among them.
  EXPECT_NE(bi.report.find("K=262144 (16 x 16384"), std::string::npos) << bi.report;
}

// The kernel itself: an exact reduction of its K split (small integers are exact in bf16 and
// fp32, so any order gives the same sum) and the row-count independence at a K that is split.
TEST(BatchInvarianceGpu, InvariantLinearIsExactOnIntegersAndRowCountFree) {
  ASSERT_TRUE(at::hasCUDA());
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  const std::int64_t k = 65536;  // 4 chunks
  ASSERT_EQ(kernels::invariant_splits(k), 4);
  const at::Tensor x = at::randint(-2, 3, {300, k}, gen).to(at::kBFloat16).to(cuda.device());
  const at::Tensor w = at::randint(-2, 3, {40, k}, gen).to(at::kBFloat16).to(cuda.device());
  const at::Tensor exact = at::matmul(x.to(at::kDouble), w.to(at::kDouble).t());
  const at::Tensor got = kernels::invariant_linear(x, w);
  EXPECT_TRUE(at::equal(got.to(at::kDouble), exact.to(at::kBFloat16).to(at::kDouble)));
  // E^T layout (the self-conditioning matmul's weight): w given as the transpose of [K, N].
  const at::Tensor e = w.t().contiguous();  // [K, N]
  EXPECT_TRUE(at::equal(kernels::invariant_linear(x, e.t()), got));
  const at::Tensor xr = at::randn({257, k}, gen).to(at::kBFloat16).to(cuda.device());
  const at::Tensor one = kernels::invariant_linear(xr.narrow(0, 0, 1), w);
  for (const std::int64_t m : {2, 7, 64, 257}) {
    EXPECT_TRUE(at::equal(kernels::invariant_linear(xr.narrow(0, 0, m), w).narrow(0, 0, 1), one))
        << "M=" << m;
  }
}

// The finder on the mid preset (real divergence of the H200's default kernels), with each
// strategy: the self-conditioning matmul alone, confirmed in free mode.
TEST(CulpritGpu, FindsTheSelfConditioningMatmulOnMidWithEitherStrategy) {
  ASSERT_TRUE(at::hasCUDA());
  experiment::ExperimentSpec spec;
  spec.model.preset = "mid";
  spec.load = cuda_load();
  spec.batch_sizes = {2, 3, 4};
  spec.repeats = 0;
  auto session = experiment::open_session_for(spec);
  ASSERT_TRUE(session.ok()) << session.error().message;
  ops::FamilySet sc;
  sc.set(static_cast<std::size_t>(ops::OpFamily::SelfCondMatmul));
  for (const ops::Strategy strategy : {ops::Strategy::RowWise, ops::Strategy::BatchInvariant}) {
    analysis::CulpritOptions o;
    o.strategy = strategy;
    o.cost_repeats = 3;
    const auto r = analysis::find_culprit(session.value(), spec, o);
    ASSERT_TRUE(r.ok()) << r.error().message;
    const experiment::CulpritReport& c = r.value();
    std::cout << c.headline({2, 3, 4}) << "\n" << c.verdict << "\n";
    EXPECT_TRUE(c.diverged);
    ASSERT_TRUE(c.found) << c.verdict;
    EXPECT_TRUE(c.confirmed) << c.verdict;
    EXPECT_EQ(families(c.fix), sc) << ops::describe(c.fix);
    for (const ops::PolicyRule& rule : c.fix.rules) {
      EXPECT_EQ(rule.strategy, strategy);
    }
    EXPECT_EQ(c.costs.size(), 3U);
  }
}

// Row-wise experts (grouped_mm per row) run inside a CUDA graph capture (no host sync) and
// compute B=1's bits: with them and the self-conditioning matmul row-wise, mid's batched runs
// are bitwise B=1's in lockstep.
TEST(CulpritGpu, RowWiseExpertsAreCapturedAndKeepRowZero) {
  ASSERT_TRUE(at::hasCUDA());
  const ops::OpPolicy experts =
      ops::policy_from_text("row_wise:expert_gate_up,expert_down,selfcond_matmul").value();
  experiment::ExperimentSpec spec;
  spec.model.preset = "mid";
  spec.load = cuda_load();
  spec.batch_sizes = {3};
  spec.repeats = 0;
  spec.mode = experiment::RunMode::Lockstep;
  spec.overrides.max_denoising_steps = 8;
  spec.overrides.max_new_tokens = 128;
  spec.policy = experts;
  auto session = experiment::open_session_for(spec);
  ASSERT_TRUE(session.ok()) << session.error().message;
  setup::ForwardRequest req;
  req.rows = 3;
  req.repeat = 2;
  req.self_conditioning = true;
  req.engine_timing = true;
  req.policy = experts;
  const auto timed = setup::run_forward_file(*session.value().model, req);
  ASSERT_TRUE(timed.ok()) << timed.error().message;
  EXPECT_NE(timed.value().engine_mode.find("CUDA graph replays"), std::string::npos)
      << timed.value().engine_mode;
  const auto r = experiment::run_experiment(session.value(), spec);
  ASSERT_TRUE(r.ok()) << r.error().message;
  for (const experiment::ComparisonResult& c : r.value().comparisons) {
    EXPECT_FALSE(c.first.found()) << c.id << " " << c.first.tap;
  }
}

}  // namespace
}  // namespace batchlens
