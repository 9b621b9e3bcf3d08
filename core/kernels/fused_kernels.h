// SPDX-License-Identifier: Apache-2.0
// Raw launchers of BatchLens's fused elementwise CUDA kernels (fused_kernels.cu). No LibTorch
// here: nvcc compiles only plain CUDA. core/kernels/fused_ops_cuda.cpp checks the tensors, picks
// the element type and calls these on the current stream. Every kernel computes, per element,
// exactly the fp32 operations of the ATen op chain it replaces, each rounded where ATen rounds
// (explicit __fmul_rn / __fadd_rn, so the compiler cannot contract them), and converts to bf16
// with the same round-to-nearest-even intrinsic ATen's CUDA kernels use. fused_ops.h names the
// chains.
#pragma once

#include <cstddef>
#include <cstdint>

namespace batchlens::kernels::cuda {

enum class Elem { F32, BF16 };
/// How the 32 lanes of a row combine their sums in mean_sq (and softmax_bf16's warps and lanes):
/// shuffles down at offsets 1, 2, 4, 8, 16 (Reduce.cuh's block_x_reduce in older releases, and in
/// ROCm builds still) or at 16, 8, 4, 2, 1 (PyTorch 2.11's CUDA build: "offset decreasing for
/// better numerics matching Triton", read from the H200's headers on 2026-12-07). The load check
/// tries each and keeps the one with ATen's bits on this device and LibTorch.
enum class MeanOrder { ShufflesUp, ShufflesDown };

/// Whether p (elements of `elem_bytes` each) is aligned for one access of four elements: what
/// every kernel's vector path needs of its pointers.
bool aligned4(const void* p, std::size_t elem_bytes);

/// The widest row the one-pass norm takes (48 KB of fp32 squares in shared memory).
constexpr std::int64_t kOnePassWidth = 12288;

/// Arguments of the RMSNorm tail (see fused_ops.h NormApply). Pointers of element type `elem`
/// unless said otherwise; null = not used.
struct NormArgs {
  Elem elem = Elem::BF16;
  const void* x = nullptr;         ///< [rows, n]
  const float* mean_sq = nullptr;  ///< [rows] fp32: mean of squares (eps is added here)
  float eps = 0.0F;
  std::int64_t rows = 0;
  std::int64_t n = 0;
  const void* weight = nullptr;    ///< [n]
  const void* rope_cos = nullptr;  ///< [seq, n]
  const void* rope_sin = nullptr;  ///< [seq, n]
  /// Rows are [batch, seq, heads] (RoPE's table row, and where out_strided puts a row).
  std::int64_t rope_heads = 1;
  std::int64_t rope_seq = 1;
  const void* scale = nullptr;  ///< [n], then * scalar
  float scalar = 1.0F;
  const void* residual = nullptr;      ///< [rows, n]
  const void* layer_scalar = nullptr;  ///< [1]
  void* out = nullptr;                 ///< [rows, n], or strided (out_strided)
  /// Row (b, s, h) of the result at out + b * out_stride_b + h * out_stride_h + s *
  /// out_stride_s (elements; x's [B, S, H, n] as a [B, H, S, n] view, such as the canvas's slots
  /// of the decoder's keys). square and mean_out are not written with it.
  bool out_strided = false;
  std::int64_t out_stride_b = 0;
  std::int64_t out_stride_h = 0;
  std::int64_t out_stride_s = 0;
  float* square = nullptr;  ///< [rows, n] fp32, optional
  /// Four elements per thread with vector loads and stores where norm_vec_fits (the same
  /// operations per element, so the same bits).
  bool vectorized = false;
  /// The whole norm in one kernel, one block per row (needs norm_vec_fits and n up to
  /// kOnePassWidth, the row's squares in shared memory): mean_sq may then be
  /// null (the kernel computes x's mean of squares as mean_sq() does, in mean_order), and
  /// mean_out, when not null, receives the result's mean of squares ([rows] fp32, what
  /// mean_sq() of the result would give).
  bool one_pass = false;
  MeanOrder mean_order = MeanOrder::ShufflesUp;
  float* mean_out = nullptr;
};

/// The vectorised tail applies: n % 4 == 0 (n % 8 == 0 with RoPE) and every pointer aligned
/// to four elements.
bool norm_vec_fits(const NormArgs& args);

/// out[i] = float(x[i]) * float(x[i]) (fp32). Returns the CUDA error code (0 = success).
int square(Elem elem, const void* x, float* out, std::int64_t count, void* stream);
/// The tail (and with one_pass the means). mean_sq is required unless one_pass; one_pass
/// without norm_vec_fits, mean_out without one_pass, or out_strided with square or mean_out is
/// cudaErrorInvalidValue.
int norm_apply(const NormArgs& args, void* stream);
/// out[r] = the mean over j < n of float(x[r, j])^2 (fp32), summed in the order of ATen's reduce
/// kernel (Reduce.cuh) for a mean over the contiguous innermost dimension of `rows` x `n` fp32
/// squares where it vectorises the input by 4 and gives each row one warp (mean_sq_fits): lane l
/// adds the 4-element vectors l, l + 32, ... into four accumulators, combines them in order,
/// the lanes combine by shuffles down at offsets 1, 2, 4, 8, 16 (MeanOrder::ShufflesUp; or 16,
/// 8, 4, 2, 1: ShufflesDown), and lane 0's sum is multiplied
/// by float(rows) / float(rows * n), MeanOps' factor. One launch instead of ATen's square and
/// mean; checked bitwise against them on the device before use (model/fused_layer.cpp), in each
/// MeanOrder until one matches.
int mean_sq(Elem elem, const void* x, float* out, std::int64_t rows, std::int64_t n,
            MeanOrder order, void* stream);
/// inv[perm[i]] = i for i < count (int64).
int inverse_permutation(const std::int64_t* perm, std::int64_t* inv, std::int64_t count,
                        void* stream);
/// out[t, h] = sum over k of float(proj[inv[t*k_count + k], h]) * weights[t*k_count + k], summed
/// in the order of ATen's reduction with `lanes` threads along k (1, 2, 4, ... 32) and four
/// accumulators per thread; rounded to `elem`. `quads` (here and in gelu_mul and softcap): four
/// consecutive elements per thread in vector accesses where the widths and pointers are aligned
/// to four elements, else one per thread; each element is computed alike either way.
int moe_combine(Elem elem, const void* proj, const float* weights, const std::int64_t* inv,
                std::int64_t tokens, int k_count, std::int64_t hidden, int lanes, bool quads,
                void* out, void* stream);
/// out[r, j] = gelu_tanh(gate[r * stride + j]) * up[r * stride + j] for j < inter (out is
/// [rows, inter]), each op rounded to `elem` as ATen's gelu and mul are. `contract` = whether
/// the gelu's x + kappa * x^3 is one fused multiply-add (as nvcc may compile ATen's functor) or
/// a multiply and an add, each rounded.
int gelu_mul(Elem elem, const void* gate, const void* up, std::int64_t stride, std::int64_t rows,
             std::int64_t inter, bool contract, bool quads, void* out, void* stream);

/// The experts' routing bookkeeping of grouped_mm_experts_forward in one kernel (one block):
/// a stable counting sort of ids [count] (values in [0, experts)), which is the order of
/// torch.sort's stable radix sort: perm [count] (sorted position -> index), token_of = perm /
/// top_k, offsets [experts] int32 = cumsum(histc(ids)), and, when row_of is not null, row_of =
/// token_of / tokens_per_row. Where route_supported (one block: 33 to 8192 ids, 1023 experts;
/// torch.sort of 32 ids and fewer is not stable).
bool route_supported(std::int64_t count, std::int64_t experts);
int route(const std::int64_t* ids, std::int64_t count, int experts, int top_k,
          std::int64_t tokens_per_row, std::int64_t* perm, std::int64_t* token_of,
          std::int32_t* offsets, std::int64_t* row_of, void* stream);

/// The router from its scores on (ref: DiffusionGemmaTextRouter.forward): for scores [rows,
/// experts] (`elem`) and per_expert_scale [experts] (`elem`), softmax(scores, -1, float32),
/// topk(k), the weights divided by their sum and multiplied by per_expert_scale[index]: weights
/// [rows, k] fp32 and index [rows, k] int64, each with ATen's bits (its warp softmax, gatherTopK,
/// SmallBitonicSort's network on ties, the sum's reduction with its block_x_reduce shuffles in
/// `order`, found by the load check). One warp per row, where router_topk_supported (up to 1024
/// experts, 1 <= k <= 32 and k <= experts).
bool router_topk_supported(std::int64_t experts, std::int64_t top_k);
int router_topk(Elem elem, const void* scores, std::int64_t rows, std::int64_t experts,
                std::int64_t top_k, const void* per_expert_scale, MeanOrder order, float* weights,
                std::int64_t* index, void* stream);

/// The experts' grouped GEMM at few rows per expert (expert_gemm.cu): out[r, :] = x[r, :] @
/// w[e]^T for the rows r in [offs[e - 1], offs[e]) of each expert e, x [rows, k] bf16, w
/// [experts, n, k] bf16 contiguous, offs [experts] int32 on the device, out [rows, n] bf16. Each
/// element is one fp32 accumulator folded over K in steps of 16 by mma.sync and rounded once,
/// which is how torch._grouped_mm's CUTLASS kernel computes it with wgmma; the load check says
/// whether this device gives the same bits, and in which fold: each k16 step one m16n8k16 MMA
/// (K16), two m16n8k8 MMAs (K8), or one wgmma m64nNk16 (Wgmma, expert_gemm_wgmma.cu: CUTLASS's
/// own instruction; compute capability 9.0 only, else an error). Where expert_gemm_supported (n
/// a multiple of 128, k of 64, 32-bit offsets).
enum class ExpertFold { K16, K8, Wgmma };
bool expert_gemm_supported(std::int64_t rows, std::int64_t experts, std::int64_t n, std::int64_t k);
int expert_gemm(const void* x, const void* w, const std::int32_t* offs, std::int64_t rows,
                std::int64_t experts, std::int64_t n, std::int64_t k, ExpertFold fold, void* out,
                void* stream);
/// expert_gemm's Wgmma fold (its arguments checked by expert_gemm).
int expert_gemm_wgmma(const void* x, const void* w, const std::int32_t* offs, int experts, int n,
                      int k, void* out, void* stream);

/// out[i] = tanhf(float(x[i]) * inv_cap) * cap (fp32), with inv_cap the fp32 reciprocal ATen
/// multiplies by when dividing by a scalar.
int softcap(Elem elem, const void* x, float inv_cap, float cap, float* out, std::int64_t count,
            bool quads, void* stream);

/// out = softmax(x, -1, dtype=float32).to(bf16) for bf16 x [rows, n], in ATen's order for rows
/// of 12288 and more, which no CUDA block holds in shared memory (cunn_SoftMaxForward with
/// `threads` (1024 or 512) a row, its block reduction's shuffles in `order`: the pair the load
/// check finds); x and out aligned to four elements.
bool softmax_bf16_fits(std::int64_t n);
int softmax_bf16(const void* x, std::int64_t rows, std::int64_t n, MeanOrder order, int threads,
                 void* out, void* stream);

/// out[i] = parts[0][i] + parts[1][i] + ... + parts[splits-1][i], added in that order in fp32
/// and rounded once to `elem` (parts is [splits, count] fp32): the fixed-order reduction of the
/// batch-invariant GEMM's K splits.
int sum_splits(Elem elem, const float* parts, int splits, std::int64_t count, void* out,
               void* stream);

/// How position_diff reads a pair's elements: floats (their bits compared, |a - b| and the ULP
/// distance taken) or plain bit patterns of 1, 2, 4 or 8 bytes (only compared).
enum class DiffKind : std::int32_t { Bits1, Bits2, Bits4, Bits8, BF16, F16, F32 };

/// One compared pair: a and b are [positions, inner] contiguous arrays of one element kind.
struct DiffPair {
  const void* a = nullptr;
  const void* b = nullptr;
  std::int64_t inner = 0;
  DiffKind kind = DiffKind::Bits1;
  std::int32_t unused = 0;
};
static_assert(sizeof(DiffPair) == 32, "DiffPair: 32 bytes, kDiffPairsPerLaunch depends on it");

/// For each of `count` pairs (a host array: the launches carry them as kernel parameters, up to
/// kDiffPairsPerLaunch per launch) and position p < positions:
///   out[(pair * 3 + 0) * positions + p] = (differing bit patterns) / inner   (fp32 division)
///   out[(pair * 3 + 1) * positions + p] = max |float(a) - float(b)| (fp32; NaN -> 0, inf -> 3e38)
///   out[(pair * 3 + 2) * positions + p] = max ULP distance, as fp32
/// (both 0 for bit-pattern kinds). One block per (position, pair); probe::position_diff is the
/// ATen definition it is tested against.
constexpr int kDiffPairsPerLaunch = 120;  // 120 * 32 bytes: within the 4 KB of kernel parameters
int position_diff(const DiffPair* pairs, std::int64_t count, std::int64_t positions, float* out,
                  void* stream);

}  // namespace batchlens::kernels::cuda
