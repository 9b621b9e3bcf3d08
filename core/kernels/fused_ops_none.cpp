// SPDX-License-Identifier: Apache-2.0
// Built when LibTorch has no CUDA: there are no fused kernels; callers check built() first.
#include "core/base/error.h"
#include "core/kernels/fused_ops.h"

namespace batchlens::kernels {
namespace {
[[noreturn]] void unavailable() {
  base::raise(base::ErrorCode::InvalidArgument, "fused kernels need a LibTorch build with CUDA");
}
}  // namespace

bool built() {
  return false;
}
at::Tensor square(const at::Tensor& /*x*/) {
  unavailable();
}
at::Tensor mean_sq(const at::Tensor& /*x*/, cuda::MeanOrder /*order*/) {
  unavailable();
}
NormResult norm_apply(const NormApply& /*args*/) {
  unavailable();
}
at::Tensor moe_combine(const at::Tensor& /*proj*/, const at::Tensor& /*weights*/,
                       const at::Tensor& /*perm*/, int /*lanes*/, bool /*quads*/) {
  unavailable();
}
at::Tensor gelu_mul(const at::Tensor& /*gate*/, const at::Tensor& /*up*/, bool /*contract*/,
                    bool /*quads*/) {
  unavailable();
}
bool route_fits(std::int64_t /*count*/, std::int64_t /*experts*/) {
  return false;
}
Route route(const at::Tensor& /*index*/, std::int64_t /*experts*/, std::int64_t /*rows*/) {
  unavailable();
}
bool router_topk_fits(std::int64_t /*experts*/, std::int64_t /*top_k*/) {
  return false;
}
std::pair<at::Tensor, at::Tensor> router_topk(const at::Tensor& /*scores*/,
                                              const at::Tensor& /*per_expert_scale*/,
                                              std::int64_t /*top_k*/, cuda::MeanOrder /*order*/) {
  unavailable();
}
bool expert_gemm_fits(const at::Tensor& /*x*/, const at::Tensor& /*w*/, const at::Tensor& /*offs*/,
                      std::int64_t /*max_rows*/) {
  return false;
}
at::Tensor device_normal(at::IntArrayRef /*shape*/, double /*scale*/, std::uint64_t /*seed*/,
                         const at::Device& /*device*/, at::ScalarType /*dtype*/) {
  unavailable();
}
std::pair<double, double> time_expert_gemm(const at::Tensor& /*x*/, const at::Tensor& /*w*/,
                                           const at::Tensor& /*offs*/, cuda::ExpertFold /*fold*/) {
  unavailable();
}
at::Tensor expert_gemm(const at::Tensor& /*x*/, const at::Tensor& /*w*/, const at::Tensor& /*offs*/,
                       cuda::ExpertFold /*fold*/) {
  unavailable();
}
at::Tensor softcap(const at::Tensor& /*logits*/, double /*cap*/, bool /*quads*/) {
  unavailable();
}

bool softmax_probs_fit(std::int64_t /*n*/) {
  return false;
}
at::Tensor softmax_probs(const at::Tensor& /*x*/, cuda::MeanOrder /*order*/, int /*threads*/) {
  unavailable();
}

at::Tensor invariant_linear(const at::Tensor& /*x*/, const at::Tensor& /*w*/) {
  unavailable();
}
int invariant_splits(std::int64_t /*k*/) {
  return 1;
}
void set_invariant_plan(base::BiPlan /*plan*/) {}

std::string invariant_linear_report() {
  return {};
}

at::Tensor position_diffs(const std::vector<cuda::DiffPair>& /*pairs*/, std::int64_t /*positions*/,
                          const at::Device& /*device*/) {
  unavailable();
}

}  // namespace batchlens::kernels
