// SPDX-License-Identifier: Apache-2.0
#include "core/model/batch_invariance.h"

#include <algorithm>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#ifdef BL_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "core/kernels/fused_ops.h"

namespace batchlens::model {

namespace {

using ops::OpFamily;

// The layer-0 (or per-step) weight of a GEMM family as the model calls F.linear with it.
at::Tensor family_weight(const InvarianceSubject& model, OpFamily family) {
  const ModelWeights& w = model.weights;
  const LayerWeights& l = w.layers.front();
  switch (family) {
    case OpFamily::QProj:
      return l.q_proj;
    case OpFamily::KProj:
      return l.k_proj;
    case OpFamily::VProj:
      return l.v_proj.defined() ? l.v_proj : l.k_proj;
    case OpFamily::OProj:
      return l.o_proj;
    case OpFamily::MlpGate:
      return l.mlp_gate;
    case OpFamily::MlpUp:
      return l.mlp_up;
    case OpFamily::MlpDown:
      return l.mlp_down;
    case OpFamily::RouterProj:
      return l.router_proj;
    case OpFamily::ExpertGateUp:
      return l.experts_gate_up.defined() ? l.experts_gate_up[0] : at::Tensor();
    case OpFamily::ExpertDown:
      return l.experts_down.defined() ? l.experts_down[0] : at::Tensor();
    case OpFamily::SelfCondMatmul:
      return w.embed.t();  // softmax(S) [T, V] @ E [V, H] is F.linear with E^T
    case OpFamily::SelfCondMlp:
      return w.sc_gate;
    case OpFamily::LmHead:
      return w.embed;
    case OpFamily::Attention:
      break;
  }
  return {};
}

bool row_block_equal(const at::Tensor& a, const at::Tensor& b) {
  const auto bits = [](const at::Tensor& t) {
    const at::Tensor c = t.contiguous();
    return c.element_size() == 4 ? c.view(at::kInt) : c.view(at::kShort);
  };
  return a.sizes() == b.sizes() && at::equal(bits(a), bits(b));
}

}  // namespace

BatchInvariance measure_batch_invariance(const InvarianceSubject& model, ops::OwnGemms own) {
  BatchInvariance out;
  const bool cuda = model.weights.device().is_cuda();
  if (cuda) {
    for (int b = 1; b <= 64; ++b) {
      out.batch_sizes.push_back(b);
    }
  } else {
    out.batch_sizes = {1, 2, 3, 4, 5, 8, 16, 33, 64};
  }
  const std::int64_t c = model.config.canvas_length;
  const int bmax = out.batch_sizes.back();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(20261217);
  const auto random = [&](const std::vector<std::int64_t>& shape) {
    return at::randn(shape, gen).to(model.weights.dtype()).to(model.weights.device());
  };
  // [bmax * c, k]: one random row block, each batch row offset by a constant of its own (so the
  // rows differ), drawn on the host only once per width: the self-conditioning input at
  // bmax = 64 is 8 GiB on the device.
  const auto rows_of = [&](std::int64_t k) {
    const at::Tensor block = random({c, k});  // [C, K]
    const at::Tensor shift = at::arange(bmax, block.options()).mul_(0.01).view({bmax, 1, 1});
    return (block.unsqueeze(0) + shift).view({bmax * c, k});  // [bmax*C, K]
  };

  std::ostringstream report;
  report << "batch invariance (row 0 at B = " << out.batch_sizes.front() << ".." << bmax
         << " vs B = 1, " << model.weights.device().str() << "):";
  const ops::OpPolicy batched = ops::OpPolicy::default_policy();
  const ops::OpPolicy invariant = ops::OpPolicy::batch_invariant_all();
  ops::OpPolicy invariant_emulated = invariant;
  invariant_emulated.emulate_split_k = ops::gemm_families();

  const bool grouped = model.grouped_experts;
  for (int f = 0; f < ops::kOpFamilyCount; ++f) {
    const auto family = static_cast<OpFamily>(f);
    const std::string name(ops::family_name(family));
    // Each check: the call at B rows and at 1 row, row block 0 compared. Errors (a kernel the
    // device lacks) count as "not invariant" and are reported.
    const auto check = [&](const ops::OpPolicy& policy,
                           const auto& call) -> std::pair<bool, std::string> {
      try {
        const ops::OpRunner one(policy, 1, own);
        const at::Tensor ref = call(one, 1);
        for (const int b : out.batch_sizes) {
          const ops::OpRunner many(policy, b, own);
          const at::Tensor got = call(many, b);
          if (!row_block_equal(got.narrow(0, 0, ref.size(0)), ref)) {
            return {false, "B=" + std::to_string(b) + " differs"};
          }
        }
        return {true, ""};
      } catch (const std::exception& e) {
        std::string what = e.what();
        what = what.substr(0, what.find('\n'));
        return {false, what.substr(0, 160)};
      }
    };
    std::pair<bool, std::string> d;
    std::pair<bool, std::string> i;
    std::pair<bool, std::string> ie{true, ""};
    if (family == OpFamily::Attention) {
      const TextConfig& t = model.config.text;
      const std::int64_t d_head = t.head_dim;
      const std::int64_t kv = c + 7;
      const at::Tensor q = random({bmax, t.num_attention_heads, c, d_head});
      const at::Tensor k = random({bmax, t.num_key_value_heads, kv, d_head});
      const at::Tensor v = random({bmax, t.num_key_value_heads, kv, d_head});
      const auto call = [&](const ops::OpRunner& r, int b) {
        const bool gqa = t.num_attention_heads != t.num_key_value_heads;
        return r.attention(q.narrow(0, 0, b), k.narrow(0, 0, b), v.narrow(0, 0, b), at::Tensor(),
                           1.0, false, gqa, 0);
      };
      d = check(batched, call);
      i = check(invariant, call);
    } else if (grouped && (family == OpFamily::ExpertGateUp || family == OpFamily::ExpertDown)) {
      // The experts as the grouped_mm implementation runs them: every token's top-k pairs
      // sorted by expert, one grouped GEMM over all groups; row 0's pairs compared in pair order.
      const LayerWeights& l = model.weights.layers.front();
      const at::Tensor w = (family == OpFamily::ExpertGateUp ? l.experts_gate_up : l.experts_down)
                               .transpose(-2, -1);  // [E, K, N]
      const std::int64_t experts = w.size(0);
      const std::int64_t top_k = model.config.text.top_k_experts;
      const at::Tensor x = rows_of(w.size(1));  // [bmax*C, K]
      // Distinct experts per token: a random first one and the next top_k - 1 after it.
      const at::Tensor first = at::randint(experts, {bmax * c, 1}, gen, at::kLong);
      const at::Tensor ids = (first + at::arange(top_k, at::kLong))
                                 .remainder_(experts)
                                 .to(model.weights.device());  // [bmax*C, top_k]
      const auto call = [&](const ops::OpRunner& r, int b) {
        const at::Tensor index = ids.narrow(0, 0, b * c).reshape(-1);  // [b*C*top_k]
        const at::Tensor perm = std::get<1>(at::sort(index, true, 0, false));
        const at::Tensor token_of = at::div(perm, top_k, "floor");
        const at::Tensor offs = at::cumsum(at::bincount(index, {}, experts), 0, at::kInt);
        const at::Tensor out = r.grouped_mm(x.index_select(0, token_of), w, offs,
                                            at::div(token_of, c, "floor"), ops::OpSite{family, 0});
        return out.index_select(0, at::argsort(perm));  // pair order: row 0's pairs first
      };
      d = check(batched, call);
      i = check(invariant, call);
    } else {
      const at::Tensor w = family_weight(model, family);
      if (!w.defined()) {
        continue;  // no such weight in this model (e.g. no experts)
      }
      // On a CPU at most 64 output columns (each column is computed on its own there); on CUDA
      // the real width, which is what picks the library's kernel.
      const at::Tensor wn = cuda ? w : w.narrow(0, 0, std::min<std::int64_t>(w.size(0), 64));
      const at::Tensor x = rows_of(w.size(1));
      const auto call = [&](const ops::OpRunner& r, int b) {
        return r.linear(x.narrow(0, 0, b * c), wn, ops::OpSite{family, 0});
      };
      d = check(batched, call);
      i = check(invariant, call);
      if (!cuda) {
        ie = check(invariant_emulated, call);
      }
    }
    if (d.first) {
      out.default_invariant.set(static_cast<std::size_t>(f));
    }
    if (i.first && ie.first) {
      out.proven.set(static_cast<std::size_t>(f));
    }
    report << "\n  " << name << ": default "
           << (d.first ? "invariant" : "varies (" + d.second + ")") << ", batch_invariant "
           << (i.first && ie.first ? "invariant"
                                   : "NOT invariant (" + (i.first ? ie.second : i.second) + ")");
  }
  if (const std::string pinned = kernels::invariant_linear_report(); cuda && !pinned.empty()) {
    report << "\n  pinned GEMMs:\n    ";
    for (const char ch : pinned) {
      report << ch;
      if (ch == '\n') {
        report << "    ";
      }
    }
  }
  out.report = report.str();
#ifdef BL_WITH_CUDA
  // The check's inputs (8 GiB for the self-conditioning matmul at B = 64) go back to the
  // device: a CUDA graph captured next allocates from a pool of its own and cannot use them.
  if (cuda) {
    c10::cuda::CUDACachingAllocator::emptyCache();
  }
#endif
  return out;
}

}  // namespace batchlens::model
