// SPDX-License-Identifier: Apache-2.0
// The op layer: every matmul-like call of the model (linear, matmul, attention, grouped GEMM)
// goes through OpRunner with its family and layer, where a policy picks how it computes
// (batched, row-wise, batch-invariant, emulated split-K).
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "core/kernels/fused_kernels.h"
#include "core/ops/op_family.h"
#include "core/ops/op_observer.h"
#include "core/ops/policy.h"

namespace batchlens::ops {

/// Where an op call sits in the model.
struct OpSite {
  OpFamily family;
  int layer;  ///< layer index, or -1 for per-step ops
};

/// How F.linear is computed on a CPU in bf16: ATen's call, or kernels::cpu_linear_bf16 (the
/// same bits, checked at model load; `fma` is the variant that matched).
struct CpuGemm {
  bool on = false;
  bool fma = false;
};

/// BatchLens's own GEMM kernels the op layer uses in place of ATen's where they fit, each with
/// the bits of the ATen call it replaces (checked at model load, FusedKernels): the CPU bf16
/// GEMM for F.linear, and the experts' grouped GEMM at few rows per expert
/// (kernels::expert_gemm) for torch._grouped_mm.
struct OwnGemms {
  CpuGemm cpu;
  bool experts = false;
  kernels::cuda::ExpertFold experts_fold = kernels::cuda::ExpertFold::K16;  ///< the one matched
  std::int64_t experts_rows = 0;  ///< used up to this average of rows an expert (timed at load)
};

/// F.linear(x, w): at::linear, or the CPU GEMM where `cpu` is on and covers the layout.
at::Tensor linear_call(const at::Tensor& x, const at::Tensor& w, CpuGemm cpu);

/// Executes the model's matmul-like calls under an OpPolicy. Every such call in the model
/// goes through here, tagged with its OpSite; the policy decides whether it runs as one
/// batched call (exactly the ATen call transformers makes) or once per logical row.
/// Not thread-safe; one per forward pass.
class OpRunner {
 public:
  /// `rows` is the logical batch size B of the forward pass.
  /// `observer`, when set, hears of every call (what ran, at which shape) and may ask for
  /// profiler marks around each.
  OpRunner(const OpPolicy& policy, std::int64_t rows, OwnGemms own = {},
           OpObserver* observer = nullptr)
      : policy_(policy), rows_(rows), own_(own), observer_(observer) {}

  std::int64_t rows() const { return rows_; }
  Strategy strategy(OpSite site) const { return policy_.resolve(site.family, site.layer); }

  /// F.linear(x, w): x [R, ..., K] whose leading dim is B or a multiple of B laid out
  /// row-major by logical row (e.g. [B*S, K]); w [N, K]. Returns [..., N] in x's dtype.
  at::Tensor linear(const at::Tensor& x, const at::Tensor& w, OpSite site) const;

  /// F.linear for rows of x that belong to arbitrary logical rows: row_of[i] is the logical
  /// row of x[i] (int64 [R] on x's device). Row-wise runs one call per logical row present.
  at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& w, const at::Tensor& row_of,
                         OpSite site) const;

  /// torch.matmul(a, b): a [B, S, K], b [K, N] (self-conditioning). Returns [B, S, N].
  at::Tensor matmul(const at::Tensor& a, const at::Tensor& b, OpSite site) const;

  /// Scaled dot-product attention, q [B, Hq, Sq, D], k/v [B, Hkv, Sk, D]; see compat::sdpa.
  at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor& mask, double scale, bool is_causal, bool enable_gqa,
                       int layer) const;

  /// Grouped GEMM over rows sorted by expert: x [R, K] (rows of expert e are
  /// x[offs[e-1]:offs[e]]), w [E, K, N] (already transposed), offs int32 [E] cumulative.
  /// row_of[i] = logical row of x[i]. Row-wise runs one grouped GEMM per logical row, on that
  /// row's rows only (still sorted by expert). Needs LibTorch's grouped_mm (2.8+, CUDA sm90);
  /// computed by kernels::expert_gemm instead where OwnGemms::experts and it fits.
  at::Tensor grouped_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offs,
                        const at::Tensor& row_of, OpSite site) const;

 private:
  // at::linear, or the emulated split-K kernel when the policy says so for this family.
  at::Tensor gemm(const at::Tensor& x, const at::Tensor& w, OpSite site) const;
  // F.linear for Strategy::BatchInvariant: one call whose per-row result does not depend on
  // the row count (CPU: kernels::cpu_linear_invariant; under emulation a split fixed at one
  // row's count). InvalidArgument on devices without such a kernel.
  at::Tensor invariant_gemm(const at::Tensor& x, const at::Tensor& w, OpSite site) const;

  // What computes F.linear(x, w) for one call of `m` rows under gemm() / invariant_gemm().
  std::string gemm_path(const at::Tensor& x, std::int64_t m, OpSite site) const;
  // Tells the observer of a call: `m` rows per call, `calls` calls; `inputs` are its operands
  // (OpObserver::on_inputs).
  void note(OpSite site, const char* op, std::int64_t m, std::int64_t n, std::int64_t k,
            std::int64_t calls, const at::Tensor& x, std::string path,
            std::initializer_list<at::Tensor> inputs = {}) const;
  // The profiler scope name for `site` when the observer marks calls, else null.
  const std::string* mark(OpSite site) const;

  const OpPolicy& policy_;
  std::int64_t rows_;
  OwnGemms own_;
  OpObserver* observer_ = nullptr;
  mutable std::string mark_;
};

/// The number of K chunks the emulated split-K kernel uses for a GEMM with M rows and
/// reduction length K: max(1, 8 / ceil(M / 16)), at most K / 32. Like GPU GEMM heuristics it
/// splits K more when M is small (fewer output tiles to keep the device busy), so a row of a
/// batch of 1 and the same row in a batch of 2+ are reduced in a different order. An
/// EMULATION for CPUs, whose kernels here are batch invariant; labelled so in every output.
int emulated_split_count(std::int64_t m, std::int64_t k);

/// F.linear(x, w) with the K reduction split in emulated_split_count(M, K) contiguous chunks:
/// partial products in x's dtype, summed in fp32 in chunk order, rounded once to x's dtype.
/// Each chunk's product is linear_call(..., cpu).
at::Tensor emulated_split_k_linear(const at::Tensor& x, const at::Tensor& w, CpuGemm cpu = {});

/// True when this build and device can run OpRunner::grouped_mm.
bool grouped_mm_available(const at::Device& device);

}  // namespace batchlens::ops
