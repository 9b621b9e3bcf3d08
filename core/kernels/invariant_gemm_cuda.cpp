// SPDX-License-Identifier: Apache-2.0
// Built when LibTorch has CUDA: the batch-invariant GEMM (ops::Strategy::BatchInvariant) on
// cuBLASLt. Why a default cuBLAS call is not batch invariant: its heuristic picks the kernel
// (tile, split-K count, stream-K) from M, so row 0 is reduced in another order at another batch
// size. Here nothing that touches the order depends on M:
//   - K is cut into invariant_splits(K) chunks, a count and boundaries that depend on K only;
//   - every chunk's product is one pinned cuBLASLt algorithm per shape (N, chunk, layout, dtype),
//     chosen once at a fixed row count with split-K and out-of-place reductions excluded, so each
//     output element is one in-order chain over its chunk whatever M is;
//   - the chunks' fp32 partials are added in chunk order and rounded once (sum_splits).
// DiffusionGemma::batch_invariance measures it at load at the model's shapes for B = 1..64 and
// refuses the strategy where row 0 differs.
#include <cstdint>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>

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

struct Plan {
  cublasLtMatmulAlgo_t algo{};
  std::string text;
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

// The first algorithm cuBLASLt's heuristic proposes at kPlanRows rows that reduces each output
// in one pass (split-K 1, no reduction scheme) and needs no workspace.
Plan choose(cublasLtHandle_t h, const Shape& s) {
  const Call call(s, kPlanRows);
  cublasLtMatmulPreference_t pref = nullptr;
  lt_check(cublasLtMatmulPreferenceCreate(&pref), "preference");
  const std::uint64_t workspace = 0;
  lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &workspace, sizeof(workspace)),
           "workspace preference");
  constexpr int kWanted = 16;
  cublasLtMatmulHeuristicResult_t results[kWanted] = {};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      h, call.op, call.a, call.b, call.d, call.d, pref, kWanted, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  lt_check(status, "cublasLtMatmulAlgoGetHeuristic");
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS || results[i].workspaceSize != 0) {
      continue;
    }
    const cublasLtMatmulAlgo_t& algo = results[i].algo;
    const auto split = algo_attr<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
    const auto scheme = algo_attr<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME);
    if (split > 1 || scheme != CUBLASLT_REDUCTION_SCHEME_NONE) {
      continue;
    }
    Plan plan;
    plan.algo = algo;
    std::ostringstream text;
    text << "N=" << s.n << " K=" << s.k << " (" << s.splits << " x " << s.chunk << ", "
         << (s.w_rows_contiguous ? "W rows" : "W columns") << ", " << (s.bf16 ? "bf16" : "fp32")
         << "): cuBLASLt algo " << algo_attr<std::int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID)
         << " tile " << algo_attr<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID) << " stages "
         << algo_attr<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID) << " swizzle "
         << algo_attr<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING) << " custom "
         << algo_attr<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION);
    plan.text = text.str();
    return plan;
  }
  TORCH_CHECK(false, "batch-invariant GEMM: cuBLASLt proposes no single-pass algorithm for N=", s.n,
              " K=", s.k, " (", found, " candidates, all split-K or needing a workspace)");
}

const Plan& plan_for(cublasLtHandle_t h, const Shape& s) {
  auto it = g_plans.find(s);
  if (it == g_plans.end()) {
    it = g_plans.emplace(s, choose(h, s)).first;
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
    const Plan& plan = plan_for(h, s);
    const Call call(s, m);
    lt_check(cublasLtMatmul(h, call.op, &alpha, wc.data_ptr(), call.a, x2.data_ptr(), call.b, &beta,
                            parts.data_ptr(), call.d, parts.data_ptr(), call.d, &plan.algo, nullptr,
                            0, stream),
             "cublasLtMatmul");
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

std::string invariant_linear_report() {
  const std::lock_guard<std::mutex> lock(g_mutex);
  return g_report;
}

}  // namespace batchlens::kernels
