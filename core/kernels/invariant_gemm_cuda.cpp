// SPDX-License-Identifier: Apache-2.0
// Built when LibTorch has CUDA: the batch-invariant GEMM (ops::Strategy::BatchInvariant) on
// cuBLASLt. Why a default cuBLAS call is not batch invariant: its heuristic picks the kernel
// (tile, split-K count, stream-K) from M, so row 0 is reduced in another order at another batch
// size. Here nothing that touches the order depends on M:
//   - K is cut into invariant_splits(K) chunks, a count and boundaries that depend on K only;
//   - every chunk's product runs cuBLASLt algorithms pinned per shape (N, chunk, layout, dtype),
//     with split-K and out-of-place reductions excluded, so each output element is one in-order
//     chain over its chunk whatever M is. The plan (base::BiPlan) is chosen once per shape:
//     cuBLASLt's single-pass proposals are timed at several row counts (B = 1 to 32 on the
//     256-position canvas) and, by default (Classes), grouped by their bits: two algorithms
//     whose outputs are bitwise equal at every timed row count on the same random input belong
//     to one class (on Hopper the single-pass kernels differ in tiles and stages, and a tile
//     does not change the order of an element's chain). The class whose fastest member at each
//     row count is nearest the fastest of all is kept, and a call runs the member fastest at
//     the timed row count nearest its M: the kernel may follow M, the bits do not. Timed keeps
//     one algorithm (the smallest worst ratio), Fixed the first proposal at 1024 rows. No later
//     call's M takes part in any choice;
//   - the chunks' fp32 partials are added in chunk order and rounded once (sum_splits).
// DiffusionGemma::batch_invariance measures it at load at the model's shapes for B = 1..64 and
// refuses the strategy where row 0 differs.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "core/kernels/fused_kernels.h"
#include "core/kernels/fused_ops.h"

namespace batchlens::kernels {
namespace {

// The row count the algorithm of a shape is chosen at (rows of B = 4 on the 256-token canvas):
// one algorithm then serves every M.
constexpr std::int64_t kPlanRows = 1024;
// K chunk of the split reduction: products with K above it (the self-conditioning matmul,
// K = 262144) are cut into K / kChunk pieces so that small M still fills the GPU.
constexpr std::int64_t kChunk = 16384;

void lt_check(cublasStatus_t status, const char* what) {
  TORCH_CHECK(status == CUBLAS_STATUS_SUCCESS, "batch-invariant GEMM: ", what,
              " failed: ", cublasLtGetStatusString(status));
}

template <class T>
T algo_attr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T value{};
  std::size_t written = 0;
  lt_check(cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof(value), &written),
           "reading the algorithm's configuration");
  return value;
}

// One product's shape as the algorithm sees it: w's layout, N, the chunk, the splits, the dtype.
struct Shape {
  bool w_rows_contiguous = true;  // w [N, K] with stride (ld, 1); else stride (1, ld)
  std::int64_t n = 0;
  std::int64_t ld_w = 0;
  std::int64_t k = 0;
  std::int64_t chunk = 0;
  int splits = 1;
  bool bf16 = true;
  int device = 0;
  auto tie() const { return std::tie(w_rows_contiguous, n, ld_w, k, chunk, splits, bf16, device); }
  bool operator<(const Shape& o) const { return tie() < o.tie(); }
};

// The descriptors of one call: D^T [N, M] = op(W chunk) [N, chunk] x X^T chunk [chunk, M] in
// cuBLAS's column-major view (row-major Y [M, N] is column-major Y^T), batched over the splits.
struct Call {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr;
  cublasLtMatrixLayout_t b = nullptr;
  cublasLtMatrixLayout_t d = nullptr;
  Call(const Shape& s, std::int64_t m) {
    const cudaDataType_t in = s.bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cudaDataType_t out = s.splits > 1 ? CUDA_R_32F : in;
    lt_check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDesc");
    const cublasOperation_t ta = s.w_rows_contiguous ? CUBLAS_OP_T : CUBLAS_OP_N;
    lt_check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
             "TRANSA");
    // A: w's chunk as stored. Rows contiguous ([N, K], stride (ld, 1)) is column-major [K, N];
    // otherwise ([N, K] with stride (1, ld), the transpose of E [K, N]) column-major [N, K].
    const std::int64_t a_rows = s.w_rows_contiguous ? s.chunk : s.n;
    const std::int64_t a_cols = s.w_rows_contiguous ? s.n : s.chunk;
    const std::int64_t a_stride = s.w_rows_contiguous ? s.chunk : s.chunk * s.ld_w;
    lt_check(cublasLtMatrixLayoutCreate(&a, in, static_cast<std::uint64_t>(a_rows),
                                        static_cast<std::uint64_t>(a_cols), s.ld_w),
             "layout A");
    lt_check(cublasLtMatrixLayoutCreate(&b, in, static_cast<std::uint64_t>(s.chunk),
                                        static_cast<std::uint64_t>(m), s.k),
             "layout B");
    lt_check(cublasLtMatrixLayoutCreate(&d, out, static_cast<std::uint64_t>(s.n),
                                        static_cast<std::uint64_t>(m), s.n),
             "layout D");
    if (s.splits > 1) {
      batched(a, s.splits, a_stride);
      batched(b, s.splits, s.chunk);
      batched(d, s.splits, s.n * m);
    }
  }
  ~Call() {
    cublasLtMatrixLayoutDestroy(d);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatmulDescDestroy(op);
  }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

 private:
  static void batched(cublasLtMatrixLayout_t layout, int count, std::int64_t stride) {
    lt_check(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                              sizeof(count)),
             "batch count");
    lt_check(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                              &stride, sizeof(stride)),
             "batch stride");
  }
};

// A shape's algorithms: one (Timed, Fixed) or a bitwise class (Classes), algos[0] the member
// that ran at every timed row count with the smallest worst ratio, the fallback.
struct Plan {
  std::vector<cublasLtMatmulAlgo_t> algos;
  std::vector<std::int64_t> rows;  // the timed row counts, ascending (Classes only)
  std::vector<std::size_t> pick;   // per timed row count: the index of its fastest member
  std::string text;

  // The member for a call of `m` rows: the fastest at the timed row count nearest m (by ratio).
  const cublasLtMatmulAlgo_t& for_rows(std::int64_t m) const {
    if (rows.empty()) {
      return algos.front();
    }
    std::size_t best = 0;
    double best_gap = std::numeric_limits<double>::infinity();
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const double gap = std::abs(std::log(static_cast<double>(std::max<std::int64_t>(m, 1)) /
                                           static_cast<double>(rows[r])));
      if (gap < best_gap) {
        best = r;
        best_gap = gap;
      }
    }
    return algos[pick[best]];
  }
};

std::mutex g_mutex;
std::map<int, cublasLtHandle_t> g_handles;  // per device
std::map<Shape, Plan> g_plans;
std::string g_report;

cublasLtHandle_t handle_for(int device) {
  auto it = g_handles.find(device);
  if (it == g_handles.end()) {
    cublasLtHandle_t h = nullptr;
    lt_check(cublasLtCreate(&h), "cublasLtCreate");
    it = g_handles.emplace(device, h).first;
  }
  return it->second;
}

// The candidates of a shape: cuBLASLt's heuristic proposals at `rows` rows that reduce each
// output in one pass (split-K 1, no reduction scheme) and need no workspace, in its order.
std::vector<cublasLtMatmulAlgo_t> proposals(cublasLtHandle_t h, const Shape& s, std::int64_t rows) {
  const Call call(s, rows);
  cublasLtMatmulPreference_t pref = nullptr;
  lt_check(cublasLtMatmulPreferenceCreate(&pref), "preference");
  const std::uint64_t workspace = 0;
  lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &workspace, sizeof(workspace)),
           "workspace preference");
  constexpr int kWanted = 16;
  std::array<cublasLtMatmulHeuristicResult_t, kWanted> results{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      h, call.op, call.a, call.b, call.d, call.d, pref, kWanted, results.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  lt_check(status, "cublasLtMatmulAlgoGetHeuristic");
  std::vector<cublasLtMatmulAlgo_t> out;
  for (int i = 0; i < found; ++i) {
    const auto& r = results[static_cast<std::size_t>(i)];
    if (r.state != CUBLAS_STATUS_SUCCESS || r.workspaceSize != 0) {
      continue;
    }
    const auto split = algo_attr<std::uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
    const auto scheme = algo_attr<std::uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME);
    if (split <= 1 && scheme == CUBLASLT_REDUCTION_SCHEME_NONE) {
      out.push_back(r.algo);
    }
  }
  return out;
}

std::string describe(const Shape& s, const cublasLtMatmulAlgo_t& algo) {
  std::ostringstream text;
  text << "N=" << s.n << " K=" << s.k << " (" << s.splits << " x " << s.chunk << ", "
       << (s.w_rows_contiguous ? "W rows" : "W columns") << ", " << (s.bf16 ? "bf16" : "fp32")
       << "): cuBLASLt algo " << algo_attr<std::int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID) << " tile "
       << algo_attr<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID) << " stages "
       << algo_attr<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID) << " swizzle "
       << algo_attr<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING) << " custom "
       << algo_attr<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION);
  return text.str();
}

// base::Switches::bi_plan (BATCHLENS_BI_PLAN), set at load.
base::BiPlan g_plan = base::BiPlan::Classes;

// The plan before timing: the first proposal at kPlanRows rows.
Plan first_proposal(cublasLtHandle_t h, const Shape& s, const char* why) {
  const auto found = proposals(h, s, kPlanRows);
  TORCH_CHECK(!found.empty(),
              "batch-invariant GEMM: cuBLASLt proposes no single-pass algorithm for N=", s.n,
              " K=", s.k, " (all split-K or needing a workspace)");
  return {{found.front()},
          {},
          {},
          describe(s, found.front()) + ", first proposal at " + std::to_string(kPlanRows) +
              " rows" + why};
}

// The row counts the candidates are timed at: B = 1, 4, 16 and 32 on the 26B-A4B canvas of 256
// positions, less those whose input would pass 1 GiB (the self-conditioning matmul's K).
std::vector<std::int64_t> timed_rows(const Shape& s) {
  constexpr std::int64_t kMaxInputBytes = std::int64_t{1} << 30;
  const std::int64_t elem = s.bf16 ? 2 : 4;
  std::vector<std::int64_t> rows;
  for (const std::int64_t m : {256, 1024, 4096, 8192}) {
    if (m * s.k * elem <= kMaxInputBytes && m * s.n * 4 * s.splits <= 4 * kMaxInputBytes) {
      rows.push_back(m);
    }
  }
  if (rows.empty()) {
    rows.push_back(std::max<std::int64_t>(1, kMaxInputBytes / (s.k * elem)));
  }
  return rows;
}

// Milliseconds of one product of `algo` at `m` rows (the split sum included), the median of three
// after a warm-up; negative when cuBLASLt refuses to run the algorithm at that shape (with no
// workspace, as every product here runs).
double time_product(cublasLtHandle_t h, const Shape& s, const cublasLtMatmulAlgo_t& algo,
                    const at::Tensor& w, const at::Tensor& x, const at::Tensor& parts,
                    const at::Tensor& out, std::int64_t m, cudaStream_t stream) {
  const Call call(s, m);
  const float alpha = 1.0F;
  const float beta = 0.0F;
  const auto once = [&]() -> bool {
    if (cublasLtMatmul(h, call.op, &alpha, w.data_ptr(), call.a, x.data_ptr(), call.b, &beta,
                       parts.data_ptr(), call.d, parts.data_ptr(), call.d, &algo, nullptr, 0,
                       stream) != CUBLAS_STATUS_SUCCESS) {
      return false;
    }
    if (s.splits > 1) {
      const int code =
          cuda::sum_splits(s.bf16 ? cuda::Elem::BF16 : cuda::Elem::F32, parts.data_ptr<float>(),
                           s.splits, m * s.n, out.data_ptr(), stream);
      TORCH_CHECK(code == 0, "batch-invariant GEMM: sum_splits: CUDA error ",
                  cudaGetErrorString(static_cast<cudaError_t>(code)));
    }
    return true;
  };
  if (!once()) {
    return -1.0;
  }
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  TORCH_CHECK(cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess,
              "batch-invariant GEMM: cudaEventCreate failed");
  std::array<float, 3> ms{};
  bool ran = true;
  for (float& t : ms) {
    cudaEventRecord(start, stream);
    ran = ran && once();
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    cudaEventElapsedTime(&t, start, stop);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ran ? ms[1] : -1.0;
}

// The plan of a shape, chosen by measurement: every candidate that cuBLASLt proposes at any of
// the timed row counts is timed at each of them on one random input, and its output there is
// compared bit for bit with the others'. Timed keeps the candidate whose worst ratio to the
// fastest at the same row count is smallest (then the smallest total time); Classes groups the
// candidates that ran everywhere with bitwise equal outputs at every row count and keeps the
// class whose fastest member per row count has the smallest worst ratio, each row count served
// by that member. Nothing of the choice depends on the M of any later call. Under CUDA graph
// capture (no timing possible) the first proposal is kept.
Plan choose(cublasLtHandle_t h, const Shape& s, const at::Tensor& w, cudaStream_t stream) {
  if (g_plan == base::BiPlan::Fixed) {
    return first_proposal(h, s, " (BATCHLENS_BI_PLAN=fixed)");
  }
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capturing) != cudaSuccess ||
      capturing != cudaStreamCaptureStatusNone) {
    return first_proposal(h, s, " (chosen under CUDA graph capture: not timed)");
  }
  const std::vector<std::int64_t> rows = timed_rows(s);
  std::vector<cublasLtMatmulAlgo_t> candidates;
  for (const std::int64_t m : rows) {
    for (const cublasLtMatmulAlgo_t& a : proposals(h, s, m)) {
      const bool seen = std::any_of(candidates.begin(), candidates.end(), [&](const auto& c) {
        return std::memcmp(c.data, a.data, sizeof(a.data)) == 0;
      });
      if (!seen) {
        candidates.push_back(a);
      }
    }
  }
  if (candidates.empty()) {
    return first_proposal(h, s, "");
  }
  const std::int64_t m_max = rows.back();
  const auto opts =
      at::TensorOptions().device(w.device()).dtype(s.bf16 ? at::kBFloat16 : at::kFloat);
  const at::Tensor x = at::randn({m_max, s.k}, opts);  // [M_max, K] scratch input
  const at::Tensor out = at::empty({m_max, s.n}, opts);
  const at::Tensor parts =
      s.splits > 1 ? at::empty({s.splits, m_max, s.n}, opts.dtype(at::kFloat)) : out;
  const std::size_t n_cand = candidates.size();
  // times[c][r]: candidate c at rows[r] (negative: refused there); bits[c][r]: the first
  // candidate whose output at rows[r] is bitwise equal to c's (c itself when none before).
  std::vector<std::vector<double>> times(n_cand, std::vector<double>(rows.size(), -1.0));
  std::vector<std::vector<std::size_t>> bits(n_cand, std::vector<std::size_t>(rows.size(), 0));
  std::vector<double> best(rows.size(), std::numeric_limits<double>::infinity());
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::vector<std::pair<std::size_t, at::Tensor>> seen;  // (candidate, its output) per bit class
    for (std::size_t c = 0; c < n_cand; ++c) {
      const double t = time_product(h, s, candidates[c], w, x, parts, out, rows[r], stream);
      times[c][r] = t;
      bits[c][r] = c;
      if (t <= 0.0) {
        continue;
      }
      best[r] = std::min(best[r], t);
      // The output's first and last rows at this row count (the split sum's result, or the
      // single pass's), at most 64 MiB: an algorithm that orders an element's chain otherwise
      // changes nearly every element, and the edge tiles are in the last rows.
      const std::int64_t keep =
          std::max<std::int64_t>(2, (std::int64_t{64} << 20) / (s.n * (s.bf16 ? 2 : 4)));
      const at::Tensor all = out.narrow(0, 0, rows[r]);  // [M, N]
      const at::Tensor y =
          rows[r] <= keep
              ? all
              : at::cat({all.narrow(0, 0, keep / 2), all.narrow(0, rows[r] - keep / 2, keep / 2)});
      const auto same = std::find_if(seen.begin(), seen.end(), [&](const auto& e) {
        return at::equal(e.second.view(s.bf16 ? at::kShort : at::kInt),
                         y.view(s.bf16 ? at::kShort : at::kInt));
      });
      if (same != seen.end()) {
        bits[c][r] = same->first;
      } else {
        seen.emplace_back(c, y.contiguous().clone());
      }
    }
  }
  // A candidate's worst ratio to the fastest and its total, over the row counts; usable only
  // when it ran at every one.
  const auto score = [&](std::size_t c, double& worst, double& total) {
    worst = 0.0;
    total = 0.0;
    for (std::size_t r = 0; r < rows.size(); ++r) {
      if (times[c][r] <= 0.0) {
        return false;
      }
      worst = std::max(worst, times[c][r] / best[r]);
      total += times[c][r];
    }
    return true;
  };
  std::size_t pick = n_cand;
  double pick_worst = std::numeric_limits<double>::infinity();
  double pick_total = 0.0;
  for (std::size_t c = 0; c < n_cand; ++c) {
    double worst = 0.0;
    double total = 0.0;
    if (score(c, worst, total) &&
        (worst < pick_worst || (worst == pick_worst && total < pick_total))) {
      pick = c;
      pick_worst = worst;
      pick_total = total;
    }
  }
  if (pick == n_cand) {
    // None runs at every timed row count: the plan before timing, whose proposal at kPlanRows
    // rows has run at every M of the load-time proof.
    return first_proposal(h, s, " (no timed candidate ran at every row count)");
  }
  std::ostringstream text;
  text << std::fixed << std::setprecision(3);
  const auto times_text = [&](const std::vector<double>& t) {
    for (std::size_t r = 0; r < rows.size(); ++r) {
      text << (r == 0 ? "" : "/") << t[r];
    }
  };
  const auto rows_text = [&]() {
    for (std::size_t r = 0; r < rows.size(); ++r) {
      text << (r == 0 ? "" : "/") << rows[r];
    }
  };
  if (g_plan == base::BiPlan::Timed) {
    text << describe(s, candidates[pick]) << ", timed: " << n_cand << " candidate(s) at M=";
    rows_text();
    text << ", ";
    times_text(times[pick]);
    text << " ms, worst x" << std::setprecision(2) << pick_worst << " of the fastest";
    return {{candidates[pick]}, {}, {}, text.str()};
  }
  // Classes: the members of each class (candidates that ran everywhere, same bits everywhere),
  // each class's fastest time per row count, and the class with the smallest worst ratio.
  std::vector<std::vector<std::size_t>> classes;
  for (std::size_t c = 0; c < n_cand; ++c) {
    double worst = 0.0;
    double total = 0.0;
    if (!score(c, worst, total)) {
      continue;
    }
    auto it = std::find_if(classes.begin(), classes.end(),
                           [&](const auto& cls) { return bits[cls.front()] == bits[c]; });
    if (it == classes.end()) {
      classes.push_back({c});
    } else {
      it->push_back(c);
    }
  }
  std::size_t chosen = 0;
  double chosen_worst = std::numeric_limits<double>::infinity();
  std::vector<std::size_t> chosen_pick;
  std::vector<double> chosen_times;
  for (std::size_t k = 0; k < classes.size(); ++k) {
    std::vector<std::size_t> fastest(rows.size(), classes[k].front());
    std::vector<double> t(rows.size(), std::numeric_limits<double>::infinity());
    double worst = 0.0;
    for (std::size_t r = 0; r < rows.size(); ++r) {
      for (const std::size_t c : classes[k]) {
        if (times[c][r] < t[r]) {
          t[r] = times[c][r];
          fastest[r] = c;
        }
      }
      worst = std::max(worst, t[r] / best[r]);
    }
    if (worst < chosen_worst) {
      chosen = k;
      chosen_worst = worst;
      chosen_pick = fastest;
      chosen_times = t;
    }
  }
  // algos[0]: the class's member with the smallest worst ratio on its own (the fallback).
  const std::vector<std::size_t>& members = classes[chosen];
  std::size_t lead = members.front();
  double lead_worst = std::numeric_limits<double>::infinity();
  for (const std::size_t c : members) {
    double worst = 0.0;
    double total = 0.0;
    if (score(c, worst, total) && worst < lead_worst) {
      lead = c;
      lead_worst = worst;
    }
  }
  Plan plan;
  plan.algos.push_back(candidates[lead]);
  for (const std::size_t c : members) {
    if (c != lead) {
      plan.algos.push_back(candidates[c]);
    }
  }
  plan.rows = rows;
  for (const std::size_t c : chosen_pick) {
    const auto at = std::find_if(plan.algos.begin(), plan.algos.end(), [&](const auto& a) {
      return std::memcmp(a.data, candidates[c].data, sizeof(a.data)) == 0;
    });
    plan.pick.push_back(static_cast<std::size_t>(at - plan.algos.begin()));
  }
  text << describe(s, candidates[lead]) << ", class of " << members.size() << " bitwise-equal of "
       << n_cand << " candidate(s) (" << classes.size() << " classes) at M=";
  rows_text();
  text << ": per M algo ";
  for (std::size_t r = 0; r < rows.size(); ++r) {
    text << (r == 0 ? "" : "/")
         << algo_attr<std::int32_t>(candidates[chosen_pick[r]], CUBLASLT_ALGO_CONFIG_ID) << " tile "
         << algo_attr<std::uint32_t>(candidates[chosen_pick[r]], CUBLASLT_ALGO_CONFIG_TILE_ID);
  }
  text << ", ";
  times_text(chosen_times);
  text << " ms, worst x" << std::setprecision(2) << chosen_worst << " of the fastest (one algo: x"
       << pick_worst << ")";
  plan.text = text.str();
  return plan;
}

const Plan& plan_for(cublasLtHandle_t h, const Shape& s, const at::Tensor& w, cudaStream_t stream) {
  auto it = g_plans.find(s);
  if (it == g_plans.end()) {
    it = g_plans.emplace(s, choose(h, s, w, stream)).first;
    g_report += (g_report.empty() ? "" : "\n") + it->second.text;
  }
  return it->second;
}

}  // namespace

int invariant_splits(std::int64_t k) {
  if (k <= kChunk || k % kChunk != 0) {
    return 1;
  }
  return static_cast<int>(k / kChunk);
}

at::Tensor invariant_linear(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.is_cuda() && w.is_cuda() && x.device() == w.device(),
              "batch-invariant GEMM: x and w must be on one CUDA device");
  TORCH_CHECK(x.scalar_type() == w.scalar_type() &&
                  (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat),
              "batch-invariant GEMM: bf16 or fp32 x and w of one dtype, got ", x.scalar_type(),
              " and ", w.scalar_type());
  TORCH_CHECK(w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1),
              "batch-invariant GEMM: x [..., K] and w [N, K] expected, got ", x.sizes(), " and ",
              w.sizes());
  const c10::cuda::CUDAGuard guard(x.device());
  const std::int64_t k = w.size(1);
  const std::int64_t n = w.size(0);
  const at::Tensor x2 = x.reshape({-1, k}).contiguous();  // [M, K]
  const std::int64_t m = x2.size(0);
  std::vector<std::int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  if (m == 0 || n == 0) {
    return at::zeros(shape, x.options());
  }
  // w as cuBLAS can read it: rows contiguous, or the transpose of a contiguous [K, N] (E).
  at::Tensor wc = w;
  const bool rows = w.stride(1) == 1 && w.stride(0) >= k;
  if (!rows && !(w.stride(0) == 1 && w.stride(1) >= n)) {
    wc = w.contiguous();
  }
  Shape s;
  s.w_rows_contiguous = wc.stride(1) == 1 && wc.stride(0) >= k;
  s.n = n;
  s.ld_w = s.w_rows_contiguous ? wc.stride(0) : wc.stride(1);
  s.k = k;
  s.splits = invariant_splits(k);
  s.chunk = k / s.splits;
  s.bf16 = x.scalar_type() == at::kBFloat16;
  s.device = x.device().index();

  const float alpha = 1.0F;
  const float beta = 0.0F;
  const at::Tensor out = at::empty({m, n}, x2.options());  // [M, N]
  const at::Tensor parts =
      s.splits > 1 ? at::empty({s.splits, m, n}, x2.options().dtype(at::kFloat)) : out;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  {
    const std::lock_guard<std::mutex> lock(g_mutex);
    cublasLtHandle_t h = handle_for(s.device);
    const Plan& plan = plan_for(h, s, wc, stream);
    const Call call(s, m);
    const auto run = [&](const cublasLtMatmulAlgo_t& algo) {
      return cublasLtMatmul(h, call.op, &alpha, wc.data_ptr(), call.a, x2.data_ptr(), call.b, &beta,
                            parts.data_ptr(), call.d, parts.data_ptr(), call.d, &algo, nullptr, 0,
                            stream);
    };
    const cublasLtMatmulAlgo_t& algo = plan.for_rows(m);
    cublasStatus_t status = run(algo);
    if (status != CUBLAS_STATUS_SUCCESS && &algo != &plan.algos.front()) {
      // A member refused at this M (it ran at every timed one): the class's all-round member,
      // the same bits.
      status = run(plan.algos.front());
    }
    lt_check(status, "cublasLtMatmul");
  }
  if (s.splits > 1) {
    const int code =
        cuda::sum_splits(s.bf16 ? cuda::Elem::BF16 : cuda::Elem::F32, parts.data_ptr<float>(),
                         s.splits, m * n, out.data_ptr(), stream);
    TORCH_CHECK(code == 0, "batch-invariant GEMM: sum_splits: CUDA error ",
                cudaGetErrorString(static_cast<cudaError_t>(code)));
  }
  return out.view(shape);
}

void set_invariant_plan(base::BiPlan plan) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_plan = plan;
}

std::string invariant_linear_report() {
  const std::lock_guard<std::mutex> lock(g_mutex);
  return g_report;
}

}  // namespace batchlens::kernels
