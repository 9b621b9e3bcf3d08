// SPDX-License-Identifier: Apache-2.0
#include "core/model/fused_layer.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "core/base/system_info.h"
#include "core/compat/torch_compat.h"
#include "core/kernels/cpu_gemm.h"
#include "core/kernels/fused_ops.h"
#include "core/model/layer_math.h"
#include "core/model/weights.h"
#include "core/ops/op_runner.h"

namespace batchlens::model {

at::Tensor gelu_mul_reference(const at::Tensor& gate, const at::Tensor& up) {
  return at::gelu(gate, "tanh") * up;
}

at::Tensor moe_combine_reference(const at::Tensor& proj, const at::Tensor& weights,
                                 const at::Tensor& perm, at::ScalarType dtype) {
  const std::int64_t tokens = weights.size(0);
  const std::int64_t top_k = weights.size(1);
  const at::Tensor sample_weights_g = weights.reshape(-1).index({perm});  // [S] fp32
  at::Tensor weighted = proj * sample_weights_g.unsqueeze(-1);            // [S, H] fp32
  at::Tensor inv_perm = at::empty_like(perm);
  inv_perm.index_put_({perm}, at::arange(perm.size(0), perm.options()));
  weighted = weighted.index({inv_perm});
  return weighted.view({tokens, top_k, proj.size(-1)}).sum(1).to(dtype);
}

kernels::Route route_reference(const at::Tensor& index, std::int64_t experts, std::int64_t rows) {
  const std::int64_t top_k = index.size(-1);
  const std::int64_t tokens = index.numel() / top_k;
  const at::Tensor expert_ids = index.reshape(-1);  // [S]
  auto [expert_ids_g, perm] = at::sort(expert_ids);
  kernels::Route r;
  r.perm = perm;
  r.token_of = at::div(perm, top_k, "floor");
  // histc: float input on the CPU, int on CUDA (deterministic there), as the reference chooses.
  const at::Tensor histc_input =
      index.device().is_cpu() ? expert_ids_g.to(at::kFloat) : expert_ids_g.to(at::kInt);
  const at::Tensor tokens_per_expert = at::histc(histc_input, experts, 0, experts - 1);
  r.offsets = at::cumsum(tokens_per_expert, 0, at::kInt);
  if (rows > 0) {
    r.row_of = at::div(r.token_of, tokens / rows, "floor");
  }
  return r;
}

at::Tensor softcap_reference(const at::Tensor& logits, double cap) {
  at::Tensor out = logits.to(at::kFloat);
  out = out / cap;
  out = at::tanh(out);
  return out * cap;
}

std::pair<at::Tensor, at::Tensor> router_topk_reference(const at::Tensor& scores,
                                                        const at::Tensor& per_expert_scale,
                                                        std::int64_t top_k) {
  const at::Tensor probs = at::softmax(scores, -1, at::kFloat);  // [T, E] fp32
  auto [weights, index] = at::topk(probs, top_k, -1);            // [T, k] fp32, int64
  weights.div_(weights.sum(-1, /*keepdim=*/true));
  weights = weights * per_expert_scale.index({index});
  return {weights, index};
}

at::Tensor router_input_reference(const at::Tensor& flat, const at::Tensor& scale, double scalar,
                                  double eps) {
  return rms_norm(flat, at::Tensor(), eps) * scale * scalar;
}

namespace {

bool bits_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) {
    return false;
  }
  const auto bits = [](const at::Tensor& t) {
    const at::Tensor c = t.contiguous();
    return c.element_size() == 4 ? c.view(at::kInt) : c.view(at::kShort);
  };
  return at::equal(bits(a), bits(b));
}

class Check {
 public:
  Check(const at::Device& device, at::ScalarType dtype)
      : gen_(at::detail::createCPUGenerator(20261202)), device_(device), dtype_(dtype) {}

  // Seeded normal values (drawn on the CPU, so the same on every device), in `dtype`.
  at::Tensor normal(at::IntArrayRef shape, double scale, at::ScalarType dtype) {
    const at::Tensor cpu = at::randn(shape, gen_, at::TensorOptions().dtype(at::kFloat)) * scale;
    return cpu.to(device_, dtype);
  }
  at::Tensor normal(at::IntArrayRef shape, double scale) { return normal(shape, scale, dtype_); }

  at::ScalarType dtype() const { return dtype_; }

 private:
  at::Generator gen_;
  at::Device device_;
  at::ScalarType dtype_;
};

// How check_norm runs the tail: one element per thread, four, or the whole norm in one pass
// (its means computed in the kernel, in `order`).
struct TailMode {
  bool vectorized = false;
  bool one_pass = false;
  kernels::cuda::MeanOrder order = kernels::cuda::MeanOrder::ShufflesUp;
};

// The RMSNorm tail in every combination the model uses, for rows of width n ([2, 8, 4, n]: 64
// rows, which the one-pass norm takes where n is a width the one-kernel mean takes).
bool check_norm(Check& c, std::int64_t n, double eps, double scalar, TailMode mode,
                std::string& why) {
  namespace fused = kernels;
  const at::Tensor x = c.normal({2, 8, 4, n}, 2.0);  // [B, S, H, D]
  const at::Tensor w = c.normal({n}, 0.5) + 1.0;
  const at::Tensor sq = fused::square(x);
  if (!bits_equal(sq, x.to(at::kFloat).pow(2))) {
    why = "square, width " + std::to_string(n);
    return false;
  }
  const at::Tensor ms = sq.mean(-1, /*keepdim=*/true);
  const auto run = [&](const std::function<void(fused::NormApply&)>& set) {
    fused::NormApply a;
    a.x = x;
    if (!mode.one_pass) {
      a.mean_sq = ms;
    }
    a.eps = eps;
    a.vectorized = mode.vectorized;
    a.one_pass = mode.one_pass;
    a.mean_order = mode.order;
    set(a);
    return fused::norm_apply(a);
  };
  const at::Tensor cos = c.normal({1, 8, n}, 0.6);
  const at::Tensor sin = c.normal({1, 8, n}, 0.6);
  const at::Tensor scale = c.normal({n}, 0.5) + 1.0;
  const at::Tensor residual = c.normal({2, 8, 4, n}, 4.0);
  const at::Tensor layer_scalar = c.normal({1}, 0.3) + 0.7;
  at::Tensor tail = residual + rms_norm(x, w, eps);
  tail.mul_(layer_scalar);
  const fused::NormResult with_tail = run([&](fused::NormApply& a) {
    a.weight = w;
    a.residual = residual;
    a.layer_scalar = layer_scalar;
    a.want_square = true;
    a.want_mean = mode.one_pass;
  });
  const std::vector<std::pair<const char*, bool>> cases = {
      {"weight",
       bits_equal(run([&](fused::NormApply& a) { a.weight = w; }).out, rms_norm(x, w, eps))},
      {"no weight", bits_equal(run([](fused::NormApply&) {}).out, rms_norm(x, at::Tensor(), eps))},
      {"rope", bits_equal(run([&](fused::NormApply& a) {
                            a.weight = w;
                            a.rope_cos = cos;
                            a.rope_sin = sin;
                          }).out,
                          apply_rope(rms_norm(x, w, eps), cos, sin))},
      {"router scaling", bits_equal(run([&](fused::NormApply& a) {
                                      a.scale = scale;
                                      a.scalar = scalar;
                                    }).out,
                                    router_input_reference(x, scale, scalar, eps))},
      {"residual", bits_equal(run([&](fused::NormApply& a) {
                                a.weight = w;
                                a.residual = residual;
                              }).out,
                              residual + rms_norm(x, w, eps))},
      {"residual and layer scalar", bits_equal(with_tail.out, tail)},
      {"square of the result", bits_equal(with_tail.square, tail.to(at::kFloat).pow(2))},
      {"mean of the result",
       !mode.one_pass ||
           bits_equal(with_tail.mean, tail.to(at::kFloat).pow(2).mean(-1, /*keepdim=*/true))},
  };
  for (const auto& [name, ok] : cases) {
    if (!ok) {
      why = std::string(name) + ", width " + std::to_string(n) +
            (mode.one_pass     ? ", one pass"
             : mode.vectorized ? ", four per thread"
                               : "");
      return false;
    }
  }
  return true;
}

// The mean of squares in one kernel against ATen's square and mean, for rows of width n at
// several row counts (a block's 16 rows, a partial last block, many blocks); `checked` counts
// the shapes compared (none where the width is not one the kernel takes).
bool check_mean(Check& c, std::int64_t n, kernels::cuda::MeanOrder order, std::string& why,
                int& checked) {
  for (const std::int64_t rows : {16, 1031, 8192}) {
    if (!kernels::mean_sq_fits(rows, n)) {
      continue;
    }
    ++checked;
    const at::Tensor x = c.normal({rows, n}, 3.0);
    if (!bits_equal(kernels::mean_sq(x, order),
                    x.to(at::kFloat).pow(2).mean(-1, /*keepdim=*/true))) {
      why = "width " + std::to_string(n) + ", " + std::to_string(rows) + " rows";
      return false;
    }
  }
  return true;
}

// The lanes layout whose sum order equals ATen's at two token counts, or 0.
int check_combine(Check& c, std::int64_t top_k, std::int64_t hidden, bool quads) {
  std::vector<int> lanes = {1, 2, 4, 8, 16, 32};
  for (const std::int64_t tokens : {64, 1024}) {
    const at::Tensor proj = c.normal({tokens * top_k, hidden}, 3.0);
    const at::Tensor weights = c.normal({tokens, top_k}, 1.0, at::kFloat).abs();
    const at::Tensor perm = at::argsort(c.normal({tokens * top_k}, 1.0, at::kFloat));
    const at::Tensor expected = moe_combine_reference(proj, weights, perm, c.dtype());
    std::vector<int> still;
    for (const int l : lanes) {
      if (bits_equal(kernels::moe_combine(proj, weights, perm, l, quads), expected)) {
        still.push_back(l);
      }
    }
    lanes = still;
  }
  return lanes.empty() ? 0 : lanes.front();
}

// The self-conditioning softmax over the vocabulary in `order` with `threads` a row against
// ATen's softmax(x, -1, float32).to(bf16), at two row counts.
bool check_probs(Check& c, std::int64_t vocab, kernels::cuda::MeanOrder order, int threads) {
  for (const std::int64_t rows : {3, 40}) {
    const at::Tensor x = c.normal({rows, vocab}, 4.0, at::kBFloat16);
    if (!bits_equal(kernels::softmax_probs(x, order, threads),
                    at::softmax(x, -1, at::kFloat).to(at::kBFloat16))) {
      return false;
    }
  }
  return true;
}

// The self-conditioning probabilities (bf16 models: the matmul's operand is bf16): the first
// threads per row and order of the block's sums with ATen's bits go into `f`; returns why none
// did.
std::string pick_probs_order(Check& c, std::int64_t vocab, at::ScalarType dtype, FusedKernels& f) {
  if (dtype != at::kBFloat16) {
    return "not a bf16 model";
  }
  if (!kernels::softmax_probs_fit(vocab)) {
    return "the vocabulary is narrower than 12288 (ATen's shared-memory softmax, not ported) "
           "or not a multiple of 4";
  }
  // A launch the device refuses (resources) leaves the softmax to ATen instead of failing the
  // load; every other kernel stays.
  try {
    for (const int threads : {1024, 512}) {
      for (const auto order :
           {kernels::cuda::MeanOrder::ShufflesUp, kernels::cuda::MeanOrder::ShufflesDown}) {
        if (check_probs(c, vocab, order, threads)) {
          f.probs = true;
          f.probs_order = order;
          f.probs_threads = threads;
          return "";
        }
      }
    }
  } catch (const std::exception& e) {
    return std::string("failed on this device: ") + e.what();
  }
  return "differs from ATen in both orders at 1024 and 512 threads";
}

// The router's softmax, top-k and weights in one kernel against ATen's chain, with the sum's
// shuffles in `order`: the model's experts and k, 1 to 1031 rows of scores drawn at two scales
// and rows full of ties (scores on a coarse grid, and a row of equal scores: which of the equal
// experts are kept and in which order is gatherTopK's and the bitonic network's).
bool check_router(Check& c, std::int64_t experts, std::int64_t top_k,
                  kernels::cuda::MeanOrder order) {
  const at::Tensor scale = (c.normal({experts}, 0.5).abs() + 0.5).to(c.dtype());
  for (const std::int64_t rows : {1, 5, 1031}) {
    for (const double spread : {1.0, 8.0}) {
      at::Tensor scores = c.normal({rows, experts}, spread);
      if (rows > 1) {
        scores[0].copy_(at::round(scores[0].to(at::kFloat) * 0.5).to(c.dtype()));  // ties
        scores[1].zero_();                                                         // all equal
      }
      const auto [weights, index] = kernels::router_topk(scores, scale, top_k, order);
      const auto [want_weights, want_index] = router_topk_reference(scores, scale, top_k);
      if (!bits_equal(weights, want_weights) || !at::equal(index, want_index)) {
        return false;
      }
    }
  }
  return true;
}

// The router in one kernel with the first order of the sum's shuffles that has ATen's bits.
void pick_router_order(Check& c, const TextConfig& text, FusedKernels& f) {
  if (!kernels::router_topk_fits(text.num_experts, text.top_k_experts)) {
    return;
  }
  for (const auto order :
       {kernels::cuda::MeanOrder::ShufflesUp, kernels::cuda::MeanOrder::ShufflesDown}) {
    if (check_router(c, text.num_experts, text.top_k_experts, order)) {
      f.router = true;
      f.router_order = order;
      return;
    }
  }
}

// The counting sort against torch.sort + histc + cumsum, at three token counts (with the
// released k, one per layout of the kernel: 2, 4 and 8 ids a thread).
bool check_route(Check& c, std::int64_t experts, std::int64_t top_k) {
  for (const std::int64_t tokens : {256, 512, 1024}) {
    if (!kernels::route_fits(tokens * top_k, experts)) {
      continue;
    }
    const at::Tensor scores = c.normal({tokens, experts}, 1.0, at::kFloat);
    const at::Tensor index = std::get<1>(at::topk(scores, top_k, -1)).contiguous();
    const kernels::Route got = kernels::route(index, experts, 4);
    const kernels::Route want = route_reference(index, experts, 4);
    if (!at::equal(got.perm, want.perm) || !at::equal(got.token_of, want.token_of) ||
        !at::equal(got.offsets, want.offsets) || !at::equal(got.row_of, want.row_of)) {
      return false;
    }
  }
  return true;
}

// Whether the experts' GEMM (with its bits) is also the faster: timed against at::_grouped_mm
// at the model's gate_up shape with up to 32 experts of 16, 32, 64 and 96 rows each, and used up
// to the last of those where it was no slower (f.experts, f.experts_rows). "" or why not.
std::string time_expert_gemm(const TextConfig& text, const at::Device& device, FusedKernels& f) {
  const std::int64_t experts = std::min<std::int64_t>(text.num_experts, 32);
  const std::int64_t n = 2 * text.moe_intermediate_size;
  const std::int64_t k = text.hidden_size;
  const at::Tensor w =
      kernels::device_normal({experts, n, k}, 0.05, 71, device, at::kBFloat16).transpose(1, 2);
  std::string first;
  for (const std::int64_t rows : {16, 32, 64, 96}) {
    const at::Tensor x =
        kernels::device_normal({experts * rows, k}, 1.0, 72 + rows, device, at::kBFloat16);
    const at::Tensor offs =
        at::arange(1, experts + 1, at::kInt).mul_(static_cast<int>(rows)).to(x.device());
    const auto [own, torch] = kernels::time_expert_gemm(x, w, offs, f.experts_fold);
    std::ostringstream line;
    line << std::fixed << std::setprecision(3) << own << " ms against at::_grouped_mm's " << torch
         << " at " << rows << " rows";
    if (first.empty()) {
      first = line.str();
    }
    if (own > torch) {
      break;
    }
    f.experts = true;
    f.experts_rows = rows;
  }
  return f.experts ? std::string() : "slower: " + first;
}

// The experts' grouped GEMM against at::_grouped_mm at the model's two shapes (gate_up: N = 2I,
// K = H; down: N = H, K = I), with 8 experts of uneven rows (none, one, several token tiles),
// once with few rows (the kernel's 64-row tiles) and once with more (its 128-row tiles), in
// each fold of K (one k16 MMA a step, two k8, and with `wgmma` one wgmma). Sets f.experts and
// f.experts_fold to the first fold with every bit equal; else says why not (the first fold's
// difference).
std::string check_expert_gemm(Check& c, const TextConfig& text, const at::Device& device,
                              FusedKernels& f, bool wgmma) {
  if (c.dtype() != at::kBFloat16 || text.num_experts <= 0) {
    return "bf16 mixture-of-experts models only";
  }
  if (!ops::grouped_mm_available(device)) {
    return "this LibTorch has no grouped_mm to match";
  }
  const std::int64_t inter = text.moe_intermediate_size;
  const std::int64_t hidden = text.hidden_size;
  struct Case {
    at::Tensor x, w, offs, want;
    std::string what;
  };
  std::vector<Case> cases;
  std::uint64_t seed = 61;  // drawn on the device: 24 to 48 M values would take the host seconds
  for (const std::vector<std::int32_t>& counts :
       {std::vector<std::int32_t>{0, 1, 7, 16, 33, 64, 96, 3},
        std::vector<std::int32_t>{130, 64, 0, 90, 100, 70, 120, 40}}) {
    std::vector<std::int32_t> ends(counts.size());
    std::int32_t rows = 0;
    for (std::size_t e = 0; e < counts.size(); ++e) {
      rows += counts[e];
      ends[e] = rows;
    }
    const auto experts = static_cast<std::int64_t>(counts.size());
    const at::Tensor offs = at::tensor(ends, at::kInt).to(device);  // [E] int32
    for (const auto& [n, k] : {std::pair{2 * inter, hidden}, std::pair{hidden, inter}}) {
      Case one{kernels::device_normal({rows, k}, 1.0, seed++, device, at::kBFloat16),  // [R, K]
               kernels::device_normal({experts, n, k}, 0.05, seed++, device, at::kBFloat16)
                   .transpose(1, 2),  // [E, K, N]
               offs,
               {},
               "N " + std::to_string(n) + ", K " + std::to_string(k) + ", " + std::to_string(rows) +
                   " rows"};
      if (!kernels::expert_gemm_fits(one.x, one.w, one.offs)) {
        return "not a shape it takes (" + one.what + ")";
      }
      one.want = compat::grouped_mm(one.x, one.w, one.offs);
      cases.push_back(std::move(one));
    }
  }
  std::string why;
  using Fold = kernels::cuda::ExpertFold;
  std::vector<Fold> folds{Fold::K16, Fold::K8};
  if (wgmma) {
    folds.push_back(Fold::Wgmma);
  }
  for (const Fold fold : folds) {
    bool same = true;
    for (const Case& one : cases) {
      at::Tensor got;
      try {
        got = kernels::expert_gemm(one.x, one.w, one.offs, fold);
      } catch (const std::exception& e) {
        if (fold != Fold::Wgmma) {
          throw;
        }
        // Refused (another device, or the sm_90a code not loaded): the mma.sync folds' reason
        // stays the report's, this one beside it.
        why += std::string(why.empty() ? "" : "; ") + "wgmma refused: " + e.what();
        same = false;
        break;
      }
      if (!bits_equal(got, one.want)) {
        if (why.empty()) {
          const auto differ = got.ne(one.want).sum().item<std::int64_t>();
          why = "differs from at::_grouped_mm: " + std::to_string(differ) + " of " +
                std::to_string(got.numel()) + " elements, " + one.what;
        }
        same = false;
        break;
      }
    }
    if (same) {
      f.experts_match = true;
      f.experts_fold = fold;
      return time_expert_gemm(text, device, f);
    }
  }
  return why;
}

// The experts' GEMM checked (check_expert_gemm), an error kept to itself (a kernel this device
// refuses: the experts stay torch's): what the report says of it.
std::string expert_gemm_report(Check& c, const TextConfig& text, const at::Device& device,
                               FusedKernels& f, bool wgmma) {
  std::string why;
  try {
    why = check_expert_gemm(c, text, device, f, wgmma);
  } catch (const std::exception& e) {
    f.experts = false;
    why = std::string("failed: ") + e.what();
  }
  if (!f.experts) {
    return "no (" + why + ")";
  }
  const char* steps = "k16 steps";
  if (f.experts_fold == kernels::cuda::ExpertFold::K8) {
    steps = "k8 steps";
  } else if (f.experts_fold == kernels::cuda::ExpertFold::Wgmma) {
    steps = "wgmma k16 steps";
  }
  return std::string("yes (") + steps + ", up to " + std::to_string(f.experts_rows) +
         " rows an expert)";
}

}  // namespace

namespace {

// The CPU GEMM where it can stand in for ATen's: bf16, and no oneDNN computing bf16 matmuls
// (it does on CPUs with AVX-512 BW/VL/DQ unless turned off; its bits are its own).
void check_cpu_gemm(const TextConfig& text, at::ScalarType dtype, const base::Switches& switches,
                    FusedKernels& f) {
  std::string line;
  if (dtype != at::kBFloat16) {
    line = "CPU GEMM: ATen's (the BatchLens kernel is for bf16)";
  } else if (!switches.fused || !switches.fused_kernel("gemm")) {
    line = "CPU bf16 GEMM: ATen's (BatchLens kernel turned off by " + switches.describe() + ")";
  } else if (base::query_cpu_isa().bf16_matmul != "ATen") {
    line = "CPU bf16 GEMM: oneDNN's (LibTorch's choice on this CPU)";
  } else {
    std::vector<std::int64_t> ks;
    for (const WeightSpec& spec : weight_specs(text)) {
      if (spec.shape.size() >= 2) {
        ks.push_back(spec.shape.back());
      }
    }
    ks.push_back(text.vocab_size);  // the self-conditioning matmul reduces over the vocabulary
    const kernels::CpuGemmCheck c = kernels::check_cpu_gemm(ks);
    f.cpu_gemm = c.use;
    f.cpu_gemm_fma = c.fma;
    line = c.report;
  }
  f.report += "; " + line;
}

}  // namespace

FusedKernels check_fused_kernels(const TextConfig& text, const at::Device& device,
                                 at::ScalarType dtype, const base::Switches& switches) {
  FusedKernels f;
  if (device.is_cpu()) {
    f.report = "fused kernels: none (not a CUDA device and build)";
    check_cpu_gemm(text, dtype, switches, f);
    return f;
  }
  if (!device.is_cuda() || !kernels::built()) {
    f.report = "fused kernels: none (not a CUDA device and build)";
    return f;
  }
  if (!switches.fused) {
    f.report = "fused kernels: off (BATCHLENS_FUSED=0)";
    return f;
  }
  if (dtype != at::kBFloat16 && dtype != at::kFloat) {
    f.report = "fused kernels: none (bf16 and fp32 only)";
    return f;
  }
  Check c(device, dtype);
  // The combine, gelu*up and soft-cap four elements per thread (vector accesses) unless turned
  // off; checked as they will run.
  f.quads = switches.fused_kernel("quads");
  const double scalar = std::pow(static_cast<double>(text.hidden_size), -0.5);
  std::string why;
  // The one-pass norm applies to the widths the one-kernel mean takes; the others keep the
  // mean and the tail apart (nothing to check for them).
  const auto norms_match = [&](TailMode mode, std::string& why_not) {
    for (const std::int64_t n : {text.hidden_size, text.head_dim, text.global_head_dim}) {
      if (mode.one_pass && !kernels::mean_sq_fits(64, n)) {
        continue;
      }
      if (!check_norm(c, n, text.rms_norm_eps, scalar, mode, why_not)) {
        return false;
      }
    }
    return true;
  };
  f.norm = norms_match(TailMode{}, why);
  std::string vec_why;
  f.norm_vec = f.norm && norms_match(TailMode{true}, vec_why);
  // The first order of the lanes' sums that gives ATen's bits at every width (the reason is the
  // first order's, which is the one read from Reduce.cuh).
  std::string mean_why;
  for (const auto order :
       {kernels::cuda::MeanOrder::ShufflesUp, kernels::cuda::MeanOrder::ShufflesDown}) {
    std::string why_not;
    int checked = 0;
    const bool same = f.norm && check_mean(c, text.hidden_size, order, why_not, checked) &&
                      check_mean(c, text.head_dim, order, why_not, checked) &&
                      check_mean(c, text.global_head_dim, order, why_not, checked);
    if (same && checked == 0) {
      mean_why = "no width of this model is one it takes";  // nothing told the orders apart
      break;
    }
    if (same) {
      f.mean = true;
      f.mean_order = order;
      break;
    }
    if (mean_why.empty()) {
      mean_why = "differs from ATen: ";
      mean_why += why_not;
    }
  }
  // The whole norm in one kernel: with the mean's order just found, the four-per-thread tail.
  std::string one_pass_why = "needs the one-kernel mean and the four-per-thread tail";
  if (f.mean && f.norm_vec) {
    f.one_pass = norms_match(TailMode{true, true, f.mean_order}, one_pass_why);
    if (!f.one_pass) {
      one_pass_why = "differs from ATen: " + one_pass_why;
    }
  }
  if (text.num_experts > 0) {
    f.combine_lanes = check_combine(c, text.top_k_experts, text.hidden_size, f.quads);
    f.combine = f.combine_lanes > 0;
    f.route = check_route(c, text.num_experts, text.top_k_experts);
    pick_router_order(c, text, f);
  }
  const at::Tensor gate_up = c.normal({256, 2 * text.moe_intermediate_size}, 3.0);
  const std::int64_t inter = text.moe_intermediate_size;
  const at::Tensor gate = gate_up.narrow(-1, 0, inter);
  const at::Tensor up = gate_up.narrow(-1, inter, inter);
  const at::Tensor gelu_expected = gelu_mul_reference(gate, up);
  for (const bool contract : {true, false}) {
    if (!f.gelu && bits_equal(kernels::gelu_mul(gate, up, contract, f.quads), gelu_expected)) {
      f.gelu = true;
      f.gelu_contract = contract;
    }
  }
  const std::string probs_why = pick_probs_order(c, text.vocab_size, dtype, f);
  const std::string experts_said = expert_gemm_report(c, text, device, f, switches.expert_wgmma);
  const at::Tensor logits = c.normal({64, 4096}, 20.0);
  f.softcap = bits_equal(kernels::softcap(logits, text.final_logit_softcapping, f.quads),
                         softcap_reference(logits, text.final_logit_softcapping));

  const auto said = [](bool ok) {
    return std::string(ok ? "yes" : "no (differs from ATen)");
  };
  const auto said_order = [](kernels::cuda::MeanOrder order) {
    return std::string(order == kernels::cuda::MeanOrder::ShufflesUp ? "yes (shuffles 1 to 16)"
                                                                     : "yes (shuffles 16 to 1)");
  };
  f.report =
      "fused kernels (checked bitwise against ATen on " + device.str() + "): norm " +
      (f.norm ? "yes" : "no (differs from ATen: " + why + ")") +
      (f.norm_vec ? " (four per thread)"
       : f.norm   ? " (one per thread: four per thread differs: " + vec_why + ")"
                  : "") +
      ", mean of squares " +
      (f.mean   ? said_order(f.mean_order)
       : f.norm ? "no (" + mean_why + ")"
                : "no (with the norm only)") +
      ", one-pass norm " + (f.one_pass ? std::string("yes") : "no (" + one_pass_why + ")") +
      ", moe combine " +
      (f.combine ? "yes (" + std::to_string(f.combine_lanes) + " lanes)" : said(false)) +
      ", gelu*up " + (f.gelu ? std::string(f.gelu_contract ? "yes (fma)" : "yes") : said(false)) +
      ", softcap " + said(f.softcap) + ", route " + said(f.route) + ", router softmax and top-k " +
      (f.router ? said_order(f.router_order) : said(false)) + ", self-conditioning softmax " +
      (f.probs ? said_order(f.probs_order) + ", " + std::to_string(f.probs_threads) + " threads"
               : "no (" + probs_why + ")") +
      ", expert GEMM " + experts_said + "; combine, gelu*up and softcap " +
      (f.quads ? "four elements per thread" : "one element per thread") +
      "; on a second stream (Q beside K/V, the dense MLP beside the routing) " +
      (switches.side_branches ? "yes" : "no (BATCHLENS_SIDE_BRANCHES=1 turns it on)");
  f.q_branch = switches.side_branches;
  f.mlp_branch = switches.side_branches;
  // BATCHLENS_FUSED_OFF=name,name: leave checked kernels unused (to bisect, and to measure each).
  if (!switches.fused_off.empty()) {
    f.norm = f.norm && switches.fused_kernel("norm");
    f.norm_vec = f.norm_vec && f.norm && switches.fused_kernel("normvec");
    f.mean = f.mean && f.norm && switches.fused_kernel("mean");
    f.one_pass = f.one_pass && f.mean && f.norm_vec && switches.fused_kernel("onepass");
    f.combine = f.combine && switches.fused_kernel("combine");
    f.gelu = f.gelu && switches.fused_kernel("gelu");
    f.softcap = f.softcap && switches.fused_kernel("softcap");
    f.route = f.route && switches.fused_kernel("route");
    f.router = f.router && switches.fused_kernel("router");
    f.probs = f.probs && switches.fused_kernel("probs");
    f.experts = f.experts && switches.fused_kernel("experts");
    f.q_branch = f.q_branch && switches.fused_kernel("qbranch");
    f.mlp_branch = f.mlp_branch && switches.fused_kernel("mlpbranch");
    f.report += "; turned off by " + switches.describe();
  }
  return f;
}

}  // namespace batchlens::model
