// SPDX-License-Identifier: Apache-2.0
// The one cost measurement (setup/policy_cost.h, issue #34): interleaved passes give every cell
// its median and interquartile range, a cost within the first policy's range is flagged, the
// machine's load and "measured on a CPU" are recorded; bad requests and cancel are errors. And
// the culprit's cost as people read it, in files with and without the spread.
#include "core/setup/policy_cost.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/experiment/culprit_report.h"
#include "core/experiment/experiment.h"
#include "core/model/config.h"
#include "core/setup/engine_pass.h"
#include "core/setup/front_door.h"

namespace batchlens::setup {
namespace {

const model::DiffusionGemma& tiny() {
  static const Session session = [] {
    model::ModelSource source;
    source.preset = "tiny";
    source.seed = 3;
    model::LoadOptions load;
    load.device = "cpu";
    auto s = open_model(source, load);
    EXPECT_TRUE(s.ok()) << s.error().message;
    return std::move(s).value();
  }();
  return *session.model;
}

TEST(PolicyCost, InterleavedPassesGiveMedianAndQuartilesPerCell) {
  PolicyCostRequest req;
  req.policies = {{"default", ops::OpPolicy{}},
                  {"row_wise", ops::policy_from_text("row_wise_all").value()}};
  req.batch_sizes = {1, 3};
  req.repeat = 7;
  int calls = 0;
  req.progress = [&calls](int done, int total) {
    ++calls;
    EXPECT_LE(done, total);
    EXPECT_EQ(total, 4);
    return true;
  };
  const auto costs = measure_policy_costs(tiny(), req);
  ASSERT_TRUE(costs.ok()) << costs.error().message;
  const PolicyCosts& c = costs.value();
  EXPECT_EQ(calls, 2);  // once per batch size
  EXPECT_TRUE(c.cpu);
  EXPECT_GT(c.cores, 0);
  EXPECT_EQ(c.repeat, 7);
  ASSERT_EQ(c.cells.size(), 2U);
  for (std::size_t p = 0; p < 2; ++p) {
    ASSERT_EQ(c.cells[p].size(), 2U);
    for (const PolicyCostCell& cell : c.cells[p]) {
      EXPECT_GT(cell.min_ms, 0.0);
      EXPECT_LE(cell.min_ms, cell.q1_ms);
      EXPECT_LE(cell.q1_ms, cell.median_ms);
      EXPECT_LE(cell.median_ms, cell.q3_ms);
      EXPECT_EQ(cell.mode, "CPU passes as the engine runs them");
    }
  }
  EXPECT_FALSE(c.cells[0][0].within_noise);  // the baseline is never "within its own noise"
  // The flag is the overlap of the two ranges, as computed.
  for (std::size_t i = 0; i < 2; ++i) {
    const auto& a = c.cells[0][i];
    const auto& b = c.cells[1][i];
    EXPECT_EQ(b.within_noise, b.q1_ms <= a.q3_ms && a.q1_ms <= b.q3_ms);
    EXPECT_EQ(c.noisy(1, i), c.busy() || b.within_noise);
  }
}

TEST(PolicyCost, BadRequestsAndCancelAreErrors) {
  PolicyCostRequest req;
  req.policies = {{"default", ops::OpPolicy{}}};
  req.batch_sizes = {0};
  req.repeat = 1;
  auto r = measure_policy_costs(tiny(), req);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, base::ErrorCode::InvalidArgument);
  req.batch_sizes = {1};
  req.repeat = 0;
  EXPECT_EQ(measure_policy_costs(tiny(), req).error().code, base::ErrorCode::InvalidArgument);
  req.repeat = 1;
  req.policies.clear();
  EXPECT_EQ(measure_policy_costs(tiny(), req).error().code, base::ErrorCode::InvalidArgument);
  req.policies = {{"default", ops::OpPolicy{}}};
  req.batch_sizes = {1, 2};
  req.progress = [](int, int) {
    return false;
  };
  EXPECT_EQ(measure_policy_costs(tiny(), req).error().code, base::ErrorCode::Cancelled);
}

TEST(PolicyCost, RandomInputsAreRowsOfOneSeededRow) {
  const EngineInputs a = random_engine_inputs(tiny(), 3, 5, 11, true);
  const EngineInputs b = random_engine_inputs(tiny(), 0, 5, 11, true);
  ASSERT_EQ(a.ids.sizes(), (std::vector<std::int64_t>{3, 5}));
  ASSERT_EQ(b.ids.size(0), 1);
  for (std::int64_t row = 0; row < 3; ++row) {
    EXPECT_TRUE(a.ids[row].equal(b.ids[0]));
    EXPECT_TRUE(a.canvas[row].equal(b.canvas[0]));
    EXPECT_TRUE(a.sc[row].equal(b.sc[0]));
  }
  EXPECT_FALSE(random_engine_inputs(tiny(), 1, 5, 12, true).ids.equal(b.ids));
}

// How the culprit's cost reads: a difference, or "within the noise", and never a CPU cost
// passed off as a GPU's; the spread survives the file's JSON, and older files (no spread) read.
TEST(CulpritCostText, NoiseAndCpuAreSaidAndTheSpreadIsKept) {
  experiment::CulpritCost k;
  k.batch_size = 4;
  k.default_ms = 10.0;
  k.fixed_ms = 10.31;
  k.default_q1_ms = 9.9;
  k.default_q3_ms = 10.1;
  k.fixed_q1_ms = 10.2;
  k.fixed_q3_ms = 10.4;
  EXPECT_EQ(k.text(), "+3.1 % at B=4");
  EXPECT_NE(k.detail().find("IQR 9.90-10.10"), std::string::npos) << k.detail();
  k.noisy = true;
  k.cpu = true;
  EXPECT_EQ(k.text(), "within the noise at B=4 (median +3.1 %) on a CPU, not a GPU cost");
  EXPECT_NE(k.detail().find("within the noise"), std::string::npos);

  experiment::CulpritReport r;
  r.costs.push_back(k);
  const auto back = experiment::culprit_from_json(experiment::to_json(r));
  ASSERT_TRUE(back.ok()) << back.error().message;
  ASSERT_EQ(back.value().costs.size(), 1U);
  const auto& kb = back.value().costs[0];
  EXPECT_DOUBLE_EQ(kb.fixed_q3_ms, 10.4);
  EXPECT_DOUBLE_EQ(kb.default_q1_ms, 9.9);
  EXPECT_TRUE(kb.noisy);
  EXPECT_TRUE(kb.cpu);

  nlohmann::json old = experiment::to_json(r);
  old["costs"][0] = {{"batch_size", 2}, {"default_ms", 1.0}, {"fixed_ms", 2.0}};
  const auto before = experiment::culprit_from_json(old);
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(before.value().costs[0].text(), "+100.0 % at B=2");
  EXPECT_EQ(before.value().costs[0].detail(), "decoder forward 1.00 ms -> 2.00 ms: +100.0 %");
  old["costs"][0]["fixed_iqr_ms"] = "wide";
  EXPECT_FALSE(experiment::culprit_from_json(old).ok());
}

// issue #37: --profile groups the kernels outside the op layer by their names (CUDA kernel names
// as LibTorch and BatchLens launch them), and says why there is no profile on a CPU.
TEST(PolicyCost, KernelKindsComeFromKernelNames) {
  EXPECT_EQ(kernel_kind("void batchlens::kernels::cuda::(anonymous namespace)::norm_kernel<"
                        "__nv_bfloat16>(...)"),
            "RMSNorm (+RoPE)");
  // The norms' one-kernel mean of squares ("other" in the H200 profile of 2026-12-07).
  EXPECT_EQ(kernel_kind("void batchlens::kernels::cuda::(anonymous namespace)::mean_sq_kernel<"
                        "__nv_bfloat16, true, true>(...)"),
            "RMSNorm (+RoPE)");
  EXPECT_EQ(kernel_kind("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, float>"),
            "softmax");
  EXPECT_EQ(kernel_kind("void batchlens::kernels::cuda::route_kernel(long const*, int)"),
            "routing (sort, top-k, gather, scatter)");
  EXPECT_EQ(kernel_kind("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>"),
            "routing (sort, top-k, gather, scatter)");
  EXPECT_EQ(kernel_kind("void at::native::vectorized_elementwise_kernel<4, "
                        "at::native::CUDAFunctor_add<c10::BFloat16>>"),
            "elementwise (ATen)");
  EXPECT_EQ(kernel_kind("Memcpy HtoD (Pageable -> Device)"), "copies");
  EXPECT_EQ(kernel_kind("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"), "other");
}

// The longest kernels outside the op layer are listed by name with their template arguments
// (the parameter list and common namespaces cut): a copy and a cast are told apart.
TEST(PolicyCost, ShortKernelNamesKeepTheTemplateArguments) {
  EXPECT_EQ(
      short_kernel_name("void batchlens::kernels::cuda::(anonymous namespace)::norm_row_kernel"
                        "<__nv_bfloat16, true>(batchlens::kernels::cuda::Norm<__nv_bfloat16>,"
                        " float)"),
      "norm_row_kernel<__nv_bfloat16, true>");
  EXPECT_EQ(
      short_kernel_name("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_"
                        "kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}, "
                        "c10::BFloat16>(int, at::native::TrivialOffsetCalculator<1>)"),
      "unrolled_elementwise_kernel<direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}, "
      "BFloat16>");
  EXPECT_EQ(short_kernel_name("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"),
            "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT");
  EXPECT_EQ(short_kernel_name("void batchlens::kernels::cuda::route_kernel(long const*, int)"),
            "route_kernel");
}

TEST(PolicyCost, AProfileOnACpuIsRefusedWithItsReason) {
  PolicyCostRequest req;
  req.policies = {{"default", ops::OpPolicy{}}};
  req.batch_sizes = {1};
  req.repeat = 2;
  req.profile = true;
  const auto costs = measure_policy_costs(tiny(), req);
  ASSERT_TRUE(costs.ok()) << costs.error().message;
  EXPECT_NE(costs.value().profile_note.find("device kernels"), std::string::npos);
  EXPECT_TRUE(costs.value().cells[0][0].profile.groups.empty());
  EXPECT_GT(costs.value().cells[0][0].median_ms, 0.0);
}

}  // namespace
}  // namespace batchlens::setup
