// SPDX-License-Identifier: Apache-2.0
#include "core/model/batch_invariance.h"

#include <algorithm>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "core/model/diffusion_gemma.h"

namespace batchlens::model {

namespace {

using ops::OpFamily;

// The layer-0 (or per-step) weight of a GEMM family as the model calls F.linear with it.
at::Tensor family_weight(const DiffusionGemma& model, OpFamily family) {
  const ModelWeights& w = model.weights();
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

BatchInvariance measure_batch_invariance(const DiffusionGemma& model, ops::CpuGemm cpu_gemm) {
  BatchInvariance out;
  const bool cuda = model.device().is_cuda();
  if (cuda) {
    for (int b = 1; b <= 64; ++b) {
      out.batch_sizes.push_back(b);
    }
  } else {
    out.batch_sizes = {1, 2, 3, 4, 5, 8, 16, 33, 64};
  }
  const std::int64_t c = model.config().canvas_length;
  const int bmax = out.batch_sizes.back();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(20261217);
  const auto random = [&](const std::vector<std::int64_t>& shape) {
    return at::randn(shape, gen).to(model.dtype()).to(model.device());
  };

  std::ostringstream report;
  report << "batch invariance (row 0 at B = " << out.batch_sizes.front() << ".." << bmax
         << " vs B = 1, " << model.device().str() << "):";
  const ops::OpPolicy batched = ops::OpPolicy::default_policy();
  const ops::OpPolicy invariant = ops::OpPolicy::batch_invariant_all();
  ops::OpPolicy invariant_emulated = invariant;
  invariant_emulated.emulate_split_k = ops::gemm_families();

  for (int f = 0; f < ops::kOpFamilyCount; ++f) {
    const auto family = static_cast<OpFamily>(f);
    const std::string name(ops::family_name(family));
    // Each check: the call at B rows and at 1 row, row block 0 compared. Errors (a kernel the
    // device lacks) count as "not invariant" and are reported.
    const auto check = [&](const ops::OpPolicy& policy,
                           const auto& call) -> std::pair<bool, std::string> {
      try {
        const ops::OpRunner one(policy, 1, cpu_gemm);
        const at::Tensor ref = call(one, 1);
        for (const int b : out.batch_sizes) {
          const ops::OpRunner many(policy, b, cpu_gemm);
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
      const TextConfig& t = model.config().text;
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
    } else {
      const at::Tensor w = family_weight(model, family);
      if (!w.defined()) {
        continue;  // no such weight in this model (e.g. no experts)
      }
      const at::Tensor wn = w.narrow(0, 0, std::min<std::int64_t>(w.size(0), 64));
      const at::Tensor x = random({bmax * c, w.size(1)});
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
  out.report = report.str();
  return out;
}

}  // namespace batchlens::model
