// SPDX-License-Identifier: Apache-2.0
// The elementwise op chains of a decoder layer as transformers runs them (ATen, op by op), and
// which of BatchLens's fused CUDA kernels (core/kernels/fused_ops.h) may replace them on a
// device: a kernel is used only after it reproduced its chain bit for bit there.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include <ATen/core/Tensor.h>

#include "core/base/switches.h"
#include "core/kernels/fused_ops.h"
#include "core/model/config.h"
#include "core/ops/op_runner.h"

namespace batchlens::model {

/// The fused kernels a model uses, each checked bitwise against its ATen chain on the device.
struct FusedKernels {
  bool norm = false;      ///< RMSNorm tails (+ RoPE, router scaling, residual, layer scalar)
  bool norm_vec = false;  ///< the tails four elements per thread (vector loads and stores)
  bool mean = false;      ///< their mean of squares in one kernel (ATen's reduction order)
  bool one_pass = false;  ///< mean and tail (and the result's mean) in one kernel per norm
  kernels::cuda::MeanOrder mean_order = kernels::cuda::MeanOrder::ShufflesUp;  ///< the one matched
  bool combine = false;   ///< the experts' weighted sum over top-k
  int combine_lanes = 0;  ///< ATen's reduction layout the combine matched
  bool gelu = false;      ///< gelu_tanh(gate) * up
  bool gelu_contract = false;
  bool softcap = false;  ///< tanh(logits / cap) * cap
  /// combine, gelu and softcap four elements per thread (vector accesses where aligned)
  bool quads = false;
  /// the self-conditioning input's softmax(S, fp32).to(bf16) in one kernel (bf16 models)
  bool probs = false;
  kernels::cuda::MeanOrder probs_order = kernels::cuda::MeanOrder::ShufflesUp;  ///< its sums'
  int probs_threads = 1024;  ///< ATen's threads per row that it matched
  bool route = false;        ///< the experts' sort, offsets and token indices
  /// the router's softmax, top-k and weights in one kernel, its sum's shuffles in router_order
  bool router = false;
  kernels::cuda::MeanOrder router_order = kernels::cuda::MeanOrder::ShufflesUp;
  /// The experts' grouped GEMM at few rows per expert by kernels::expert_gemm (the op layer's
  /// OwnGemms::experts): at::_grouped_mm's bits at the model's two shapes, bf16.
  bool experts = false;
  bool experts_match = false;  ///< a fold had at::_grouped_mm's bits (used or not)
  kernels::cuda::ExpertFold experts_fold = kernels::cuda::ExpertFold::K16;  ///< the one matched
  /// used while the average expert has at most this many rows: the largest of 16, 32, 64, 96
  /// up to which it was no slower than at::_grouped_mm at the model's gate_up shape (timed at
  /// load)
  std::int64_t experts_rows = 0;
  /// Independent parts of a layer at once on a second stream (compat::SideBranch), the same
  /// kernels on the same operands (nothing to check bitwise); CUDA only, and only where
  /// base::Switches::side_branches asks for them. Q beside K/V:
  bool q_branch = false;
  /// the dense MLP beside the router and the experts' routing (joined before their GEMMs):
  bool mlp_branch = false;
  /// CPU: bf16 GEMMs through kernels::cpu_linear_bf16 (ATen's own kernel's bits, faster).
  bool cpu_gemm = false;
  bool cpu_gemm_fma = false;  ///< the variant that matched ATen
  std::string report;         ///< one human-readable line: what is used, what not and why

  /// The GEMMs of BatchLens's own the op layer may use (none where `on` is false).
  ops::OwnGemms own_gemms(bool on = true) const {
    return {{on && cpu_gemm, cpu_gemm_fma}, on && experts, experts_fold, experts_rows};
  }

  /// Any of the CUDA kernels (cpu_gemm is not one).
  bool any() const {
    return norm || mean || combine || gelu || softcap || route || router || probs || experts;
  }
};

/// Checks each fused kernel on `device` against the ATen chain, on seeded random data with the
/// model's widths (hidden size, both head dims, top-k, a slice of the vocabulary), and returns
/// those that matched bitwise. All false off CUDA, in builds without the kernels, or when
/// `switches` turn them off (BATCHLENS_FUSED=0); those `switches` name (BATCHLENS_FUSED_OFF=
/// norm,normvec,mean,onepass,combine,gelu,softcap,route,router,quads,probs,experts,qbranch,
/// mlpbranch) are left unused (`room` is the model's: base::Switches::kv_room); with
/// `switches.expert_wgmma` the experts' GEMM may also be checked in its wgmma fold. On a CPU in
/// bf16 where LibTorch computes bf16 matmuls with ATen's own kernel, checks the CPU GEMM instead
/// (kernels::check_cpu_gemm at the model's reduction lengths; BATCHLENS_FUSED_OFF=gemm leaves it
/// unused). Synchronises with the device (call it at load).
FusedKernels check_fused_kernels(const TextConfig& text, const at::Device& device,
                                 at::ScalarType dtype, const base::Switches& switches = {});

/// ATen chains (ref: transformers 5.17), used by the model and by the checks.
/// gelu_tanh(gate) * up. ref: DiffusionGemmaText4MLP.forward, _default_apply_gate
at::Tensor gelu_mul_reference(const at::Tensor& gate, const at::Tensor& up);
/// (proj * weights.reshape(-1)[perm, None])[inv_perm].view(T, K, H).sum(1).to(dtype).
/// ref: grouped_mm_experts_forward
at::Tensor moe_combine_reference(const at::Tensor& proj, const at::Tensor& weights,
                                 const at::Tensor& perm, at::ScalarType dtype);
/// torch.sort(index.reshape(-1)), perm // K, cumsum(histc(sorted, E, 0, E - 1)) as int32, and
/// with rows > 0 the batch row of each sorted slot. ref: grouped_mm_experts_forward
kernels::Route route_reference(const at::Tensor& index, std::int64_t experts, std::int64_t rows);
/// tanh(logits.float() / cap) * cap. ref: DiffusionGemmaForBlockDiffusion.forward
at::Tensor softcap_reference(const at::Tensor& logits, double cap);
/// softmax(scores, -1, float32), topk(k), w / w.sum(-1), w * per_expert_scale[index]: (weights
/// [T, k] fp32, index [T, k] int64). ref: DiffusionGemmaTextRouter.forward
std::pair<at::Tensor, at::Tensor> router_topk_reference(const at::Tensor& scores,
                                                        const at::Tensor& per_expert_scale,
                                                        std::int64_t top_k);
/// rms_norm(x) * scale * scalar. ref: DiffusionGemmaTextRouter.forward
at::Tensor router_input_reference(const at::Tensor& flat, const at::Tensor& scale, double scalar,
                                  double eps);

}  // namespace batchlens::model
