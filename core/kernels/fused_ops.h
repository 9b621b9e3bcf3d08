// SPDX-License-Identifier: Apache-2.0
// Fused elementwise kernels for the decoder layer on CUDA, each bitwise equal to the ATen op
// chain it replaces (the chains are in core/model/layer_ops.cpp, which also checks every
// kernel against them on the device before using it). What fusing saves is launches and memory
// passes: a decoder layer of the 26B-A4B model at B = 1 runs ~170 small kernels whose time is
// mostly launch latency. Arithmetic and rounding stay those of ATen (fused_kernels.cu says how).
// Builds without CUDA compile fused_ops_none.cpp: built() is false and nothing else may be called.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/base/switches.h"
#include "core/kernels/fused_kernels.h"

namespace batchlens::kernels {

/// True when this build has the CUDA kernels.
bool built();

/// x.to(float).pow(2): fp32, contiguous, shaped like x. x: contiguous bf16 or fp32 CUDA tensor.
at::Tensor square(const at::Tensor& x);

/// Whether ATen reduces x.float().pow(2).mean(-1) of `rows` rows of width `n` with the layout
/// mean_sq() reproduces (setReduceConfig: the input vectorised by 4 when n > 128, 32 lanes and
/// 16 rows per block when rows >= 16, one warp per row while ceil(n / 32) < 256; fp32 squares
/// under 2^31 bytes, indexed in 32 bits), with rows * n exact in fp32 (the factor's divisor).
inline bool mean_sq_fits(std::int64_t rows, std::int64_t n) {
  if (n < 1 || rows < 16 || rows > (std::int64_t{1} << 29) / n) {
    return false;  // ATen splits inputs of 2^31 bytes and more into 32-bit-indexed parts
  }
  const std::int64_t numel = rows * n;
  const bool exact = static_cast<std::int64_t>(static_cast<float>(numel)) == numel;
  return n % 4 == 0 && n > 128 && (n + 31) / 32 < 256 && exact;
}

/// x.float().pow(2).mean(-1, keepdim=True) with ATen's bits where mean_sq_fits and `order` is
/// the one ATen's kernel has here (FusedKernels::mean_order, found at load): [..., 1] fp32.
/// x: contiguous bf16 or fp32 CUDA tensor.
at::Tensor mean_sq(const at::Tensor& x, cuda::MeanOrder order);

/// The RMSNorm tail and what follows it elementwise, in this order (each optional step as
/// ATen computes it, rounding to x's dtype after every op):
///   y = (x.float() * pow(mean_sq + eps, -0.5)) [* weight.float()]  -> x.dtype
///   [rope]      y = y * cos + rotate_half(y) * sin    (x is [B, S, H, D], cos/sin [1, S, D])
///   [scale]     y = y * scale * scalar                 (the router's input scaling)
///   [residual]  y = residual + y
///   [layer]     y = y * layer_scalar
/// and, with want_square, also y.float().pow(2) (the next RMSNorm's first step).
/// one_pass: the whole norm in one kernel, one block per row (rows and width where mean_sq_fits):
/// mean_sq may then be left undefined (computed in the kernel as mean_sq(x, mean_order) would),
/// and want_mean gives the result's mean of squares as mean_sq(out, mean_order) would (the next
/// RMSNorm's mean, without reading the result again). A view off the vector alignment runs
/// mean_sq and the tail apart, with the same bits.
struct NormApply {
  at::Tensor x;        ///< [..., N] contiguous, bf16 or fp32
  at::Tensor mean_sq;  ///< [..., 1] fp32: square(x).mean(-1, keepdim) (undefined: one_pass)
  double eps = 1e-6;
  at::Tensor weight;    ///< [N] or undefined
  at::Tensor rope_cos;  ///< [1, S, N] or undefined
  at::Tensor rope_sin;
  at::Tensor scale;  ///< [N] or undefined
  double scalar = 1.0;
  at::Tensor residual;      ///< like x, or undefined
  at::Tensor layer_scalar;  ///< one element, or undefined
  bool want_square = false;
  bool vectorized = false;  ///< four elements per thread where the shape and pointers allow
  bool one_pass = false;
  cuda::MeanOrder mean_order = cuda::MeanOrder::ShufflesUp;  ///< one_pass: the mean's order
  bool want_mean = false;                                    ///< one_pass only
  /// Where the result goes instead of a new tensor: a [B, H, S, N] view (its last dimension
  /// contiguous, x's dtype and device) for x [B, S, H, N], such as the canvas's slots of the
  /// decoder's keys; the result is then into.transpose(1, 2). Not with want_square / want_mean.
  at::Tensor into;
};

struct NormResult {
  at::Tensor out;     ///< like x (with `into`: its [B, S, H, N] view)
  at::Tensor square;  ///< fp32 like x, when asked
  at::Tensor mean;    ///< [..., 1] fp32: the result's mean of squares, with want_mean
};

NormResult norm_apply(const NormApply& args);

/// grouped_mm_experts_forward's tail: (proj * weights[perm]).[inv_perm].view(T, K, H).sum(1)
/// .to(proj.dtype), summed in the order of ATen's reduction with `lanes` threads along K.
/// proj [T*K, H] (rows sorted by expert), weights [T, K] fp32 (router order), perm [T*K] int64
/// (sorted position -> router-order index). `quads` (here, in gelu_mul and softcap): four
/// elements per thread with vector accesses where aligned (the same bits; false: one per thread).
at::Tensor moe_combine(const at::Tensor& proj, const at::Tensor& weights, const at::Tensor& perm,
                       int lanes, bool quads = true);

/// gelu_tanh(gate) * up for gate and up [R, I] views with the same row stride (two tensors,
/// or the halves of one [R, 2I] tensor); returns [R, I] contiguous. `contract`: see
/// fused_kernels.h.
at::Tensor gelu_mul(const at::Tensor& gate, const at::Tensor& up, bool contract, bool quads = true);

/// The experts' routing bookkeeping (ref: grouped_mm_experts_forward): for index [T, K] int64
/// (expert ids in [0, experts)), perm = the stable sort order of index.reshape(-1) (what
/// torch.sort returns), token_of = perm // K, offsets = cumsum(histc(sorted ids)) int32, and
/// with rows > 0 also row_of = token_of // (T / rows).
struct Route {
  at::Tensor perm;      ///< [T*K] int64
  at::Tensor token_of;  ///< [T*K] int64
  at::Tensor offsets;   ///< [experts] int32
  at::Tensor row_of;    ///< [T*K] int64, or undefined
};
/// Whether route() takes this many ids and experts (one block's shared memory).
bool route_fits(std::int64_t count, std::int64_t experts);
Route route(const at::Tensor& index, std::int64_t experts, std::int64_t rows);

/// The router after its projection (ref: DiffusionGemmaTextRouter.forward): softmax(scores, -1,
/// float32), topk(k), the weights divided by their sum and multiplied by
/// per_expert_scale[index], in one kernel with ATen's bits where router_topk_fits and `order` is
/// the one the load check found (fused_kernels.h says how). scores [T, E] contiguous bf16 or
/// fp32 CUDA, per_expert_scale [E] of its dtype. Returns (weights [T, k] fp32, index [T, k]
/// int64).
bool router_topk_fits(std::int64_t experts, std::int64_t top_k);
std::pair<at::Tensor, at::Tensor> router_topk(const at::Tensor& scores,
                                              const at::Tensor& per_expert_scale,
                                              std::int64_t top_k, cuda::MeanOrder order);

/// The experts' grouped GEMM as torch._grouped_mm(x, w, offs) computes it (ref:
/// grouped_mm_experts_forward), by BatchLens's kernel for few rows per expert
/// (cuda::expert_gemm): x [R, K] bf16 contiguous, rows sorted by expert; w [E, K, N] bf16, the
/// transpose of a contiguous [E, N, K]; offs [E] int32 cumulative ends. expert_gemm_fits says
/// whether the kernel takes the operands and the rows are few enough (an average of at most
/// `max_rows` per expert, at most kExpertGemmRows) for it to be the faster one (the load check
/// times it, FusedKernels::experts_rows); its bits are at::_grouped_mm's only where the load
/// check found them so (FusedKernels::experts).
constexpr std::int64_t kExpertGemmRows = 96;
bool expert_gemm_fits(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offs,
                      std::int64_t max_rows = kExpertGemmRows);
at::Tensor expert_gemm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offs,
                       cuda::ExpertFold fold);
/// Seeded normal values times `scale`, drawn on the CUDA `device` by a generator of its own (the
/// load checks' large operands: drawing them on the host takes seconds), in `dtype`.
at::Tensor device_normal(at::IntArrayRef shape, double scale, std::uint64_t seed,
                         const at::Device& device, at::ScalarType dtype);
/// The device time of expert_gemm and of at::_grouped_mm on the same operands, in ms (the
/// median of five runs after one; CUDA events on the current stream; synchronises).
std::pair<double, double> time_expert_gemm(const at::Tensor& x, const at::Tensor& w,
                                           const at::Tensor& offs, cuda::ExpertFold fold);

/// The final soft-cap: tanh(logits.float() / cap) * cap, fp32 (division by a scalar is ATen's
/// multiplication by the fp32 reciprocal).
at::Tensor softcap(const at::Tensor& logits, double cap, bool quads = true);

/// softmax(x, -1, dtype=float32).to(bf16) for bf16 x [..., n] (contiguous, where
/// softmax_probs_fit(n)), with ATen's bits when `order` and `threads` (1024 or 512 a row) are
/// the ones the load check found: the self-conditioning input's probabilities in one kernel (no
/// fp32 copy of x, no fp32 result).
bool softmax_probs_fit(std::int64_t n);
at::Tensor softmax_probs(const at::Tensor& x, cuda::MeanOrder order, int threads);

/// F.linear(x, w) for ops::Strategy::BatchInvariant on CUDA: x [..., K], w [N, K] (rows
/// contiguous, or the transpose of a contiguous [K, N] such as E^T), bf16 or fp32; returns
/// [..., N] in x's dtype. Row r of the result does not depend on how many rows x has: K is cut
/// into invariant_splits(K) chunks (a function of K only), each chunk's product runs a
/// cuBLASLt algorithm of one bitwise class pinned per shape (no split-K, no workspace; the
/// class's member may follow M, its bits do not), and the fp32 partials are
/// added in chunk order and rounded once. invariant_gemm_cuda.cpp says why.
at::Tensor invariant_linear(const at::Tensor& x, const at::Tensor& w);
/// The chunk count of invariant_linear for a reduction of length k.
int invariant_splits(std::int64_t k);
/// How invariant_linear picks a shape's algorithms, for the shapes not planned yet
/// (base::Switches::bi_plan, BATCHLENS_BI_PLAN): every plan is batch invariant.
void set_invariant_plan(base::BiPlan plan);
/// The algorithms invariant_linear has pinned so far, one line per shape ("" before the first).
std::string invariant_linear_report();

/// Comparison of tapped tensors, up to 120 pairs per launch (probe::position_diffs on CUDA):
/// `pairs` point into CUDA tensors on `device` ([positions, inner] each, kept alive by the caller
/// until this returns: the work is queued on the current stream); returns [n, 3, positions] fp32,
/// per position the share of differing bit patterns, max |Δ| and max ULP distance
/// (probe::position_diff defines them).
at::Tensor position_diffs(const std::vector<cuda::DiffPair>& pairs, std::int64_t positions,
                          const at::Device& device);

}  // namespace batchlens::kernels
