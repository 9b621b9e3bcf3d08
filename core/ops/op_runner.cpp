// SPDX-License-Identifier: Apache-2.0
#include "core/ops/op_runner.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "core/base/error.h"
#include "core/compat/profile.h"
#include "core/compat/torch_compat.h"
#include "core/kernels/cpu_gemm.h"
#include "core/kernels/fused_ops.h"

namespace batchlens::ops {

namespace {

// Splits dim 0 of x into `rows` equal contiguous blocks (one per logical row), applies f to
// each and concatenates. Each block is exactly what the op would see at batch size 1.
template <class F>
at::Tensor per_row_blocks(const at::Tensor& x, std::int64_t rows, F&& f) {
  TORCH_CHECK(x.size(0) % rows == 0, "row-wise op: leading dim ", x.size(0),
              " is not a multiple of the batch size ", rows);
  const std::int64_t block = x.size(0) / rows;
  std::vector<at::Tensor> parts;
  parts.reserve(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    parts.push_back(f(x.narrow(0, r * block, block)));
  }
  return at::cat(parts, 0);
}

// Runs f on the rows of x belonging to each logical row (their indices, ascending, from
// index_of(r)) and scatters the results back into x's row order.
template <class IndexOf, class F>
at::Tensor gather_apply_scatter(const at::Tensor& x, std::int64_t rows, IndexOf&& index_of, F&& f) {
  at::Tensor out;
  for (std::int64_t r = 0; r < rows; ++r) {
    const at::Tensor idx = index_of(r);  // [n_r] int64
    if (idx.numel() == 0) {
      continue;
    }
    const at::Tensor part = f(x.index_select(0, idx), r, idx);
    if (!out.defined()) {
      std::vector<std::int64_t> shape(part.sizes().begin(), part.sizes().end());
      shape[0] = x.size(0);
      out = at::zeros(shape, part.options());
    }
    out.index_copy_(0, idx, part);
  }
  return out;
}

// Each logical row's rows of x found by row_of (any count per row; synchronises with the host).
template <class F>
at::Tensor per_row_gather(const at::Tensor& x, const at::Tensor& row_of, std::int64_t rows, F&& f) {
  return gather_apply_scatter(
      x, rows, [&](std::int64_t r) { return (row_of == r).nonzero().squeeze(1); },
      std::forward<F>(f));
}

// per_row_gather where every logical row owns the same number of x's rows (each token's top-k
// expert pairs): a stable sort of row_of gives each row's indices in ascending order, the order
// nonzero gives, without a host synchronisation, so it runs inside a CUDA graph capture.
template <class F>
at::Tensor per_row_uniform(const at::Tensor& x, const at::Tensor& row_of, std::int64_t rows,
                           F&& f) {
  TORCH_CHECK(x.size(0) % rows == 0, "row-wise op: ", x.size(0), " rows are not ", rows,
              " equal parts");
  const std::int64_t n = x.size(0) / rows;
  const at::Tensor order =
      std::get<1>(at::sort(row_of, /*stable=*/true, /*dim=*/0, /*descending=*/false));  // [R*n]
  return gather_apply_scatter(
      x, rows, [&](std::int64_t r) { return order.narrow(0, r * n, n); }, std::forward<F>(f));
}

}  // namespace

int emulated_split_count(std::int64_t m, std::int64_t k) {
  const std::int64_t tiles = std::max<std::int64_t>(1, (m + 15) / 16);
  const std::int64_t by_rows = std::max<std::int64_t>(1, 8 / tiles);
  return static_cast<int>(std::max<std::int64_t>(1, std::min(by_rows, k / 32)));
}

at::Tensor linear_call(const at::Tensor& x, const at::Tensor& w, CpuGemm cpu) {
  if (cpu.on && kernels::cpu_linear_bf16_covers(x, w)) {
    return kernels::cpu_linear_bf16(x, w, cpu.fma);
  }
  return at::linear(x, w);
}

namespace {

// F.linear(x, w) with K cut in `splits` contiguous chunks, each chunk's product part(x_c, w_c),
// summed in fp32 in chunk order and rounded once to x's dtype.
template <class Part>
at::Tensor split_k_linear(const at::Tensor& x, const at::Tensor& w, int splits, Part&& part) {
  const std::int64_t k = x.size(-1);
  const std::int64_t m = k > 0 ? x.numel() / k : 0;
  if (splits == 1 || m == 0) {
    return part(x, w);
  }
  // Partial products in the model's dtype (the CPU kernel here is batch invariant), summed in
  // fp32 in chunk order and rounded once: the reduction order depends on M through `splits`.
  const at::Tensor x2 = x.reshape({m, k});
  const std::int64_t chunk = (k + splits - 1) / splits;
  at::Tensor acc;
  for (std::int64_t lo = 0; lo < k; lo += chunk) {
    const std::int64_t len = std::min(chunk, k - lo);
    const at::Tensor p = part(x2.narrow(1, lo, len), w.narrow(1, lo, len)).to(at::kFloat);
    acc = acc.defined() ? acc.add_(p) : p;
  }
  std::vector<std::int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = w.size(0);
  return acc.to(x.scalar_type()).view(shape);
}

}  // namespace

at::Tensor emulated_split_k_linear(const at::Tensor& x, const at::Tensor& w, CpuGemm cpu) {
  const std::int64_t k = x.size(-1);
  const std::int64_t m = k > 0 ? x.numel() / k : 0;
  return split_k_linear(
      x, w, emulated_split_count(m, k),
      [cpu](const at::Tensor& a, const at::Tensor& b) { return linear_call(a, b, cpu); });
}

at::Tensor OpRunner::invariant_gemm(const at::Tensor& x, const at::Tensor& w, OpSite site) const {
  if (x.device().is_cuda()) {
    // Pinned cuBLASLt algorithms over a K split fixed by K (kernels::invariant_linear).
    return kernels::invariant_linear(x, w);
  }
  if (!x.device().is_cpu()) {
    base::raise(base::ErrorCode::InvalidArgument,
                "the batch_invariant strategy (" + std::string(family_name(site.family)) +
                    ") has no kernel on " + x.device().str() + "; use row_wise there");
  }
  const bool fma = own_.cpu.on ? own_.cpu.fma : true;
  const auto part = [fma](const at::Tensor& a, const at::Tensor& b) {
    return kernels::cpu_linear_invariant(a, b, fma);
  };
  if (!policy_.emulates(site.family)) {
    return part(x, w);
  }
  // The emulated GPU library with its split fixed at what one row gets: the count and the
  // boundaries no longer follow M (ref: the "split whose count does not depend on M").
  return split_k_linear(x, w, emulated_split_count(1, x.size(-1)), part);
}

std::string OpRunner::gemm_path(const at::Tensor& x, std::int64_t m, OpSite site) const {
  const std::int64_t k = x.size(-1);
  if (strategy(site) == Strategy::BatchInvariant) {
    if (x.device().is_cuda()) {
      return "cuBLASLt pinned algorithm, " + std::to_string(kernels::invariant_splits(k)) +
             " K-split(s)";
    }
    return policy_.emulates(site.family)
               ? "BatchLens invariant CPU GEMM, emulated split fixed at " +
                     std::to_string(emulated_split_count(1, k)) + " K-chunks"
               : std::string("BatchLens invariant CPU GEMM");
  }
  if (policy_.emulates(site.family)) {
    return "emulated split-K: " + std::to_string(emulated_split_count(m, k)) + " K-chunks";
  }
  if (x.device().is_cpu() && own_.cpu.on && x.scalar_type() == at::kBFloat16) {
    return "BatchLens CPU GEMM (ATen's bits)";
  }
  return "at::linear";
}

void OpRunner::note(OpSite site, const char* op, std::int64_t m, std::int64_t n, std::int64_t k,
                    std::int64_t calls, const at::Tensor& x, std::string path,
                    std::initializer_list<at::Tensor> inputs) const {
  if (observer_ == nullptr) {
    return;
  }
  OpCall c;
  c.family = site.family;
  c.layer = site.layer;
  c.op = op;
  c.strategy = strategy(site);
  c.m = m;
  c.n = n;
  c.k = k;
  c.calls = calls;
  c.dtype = std::string(c10::toString(x.scalar_type()));
  c.path = std::move(path);
  observer_->on_op(c);
  if (inputs.size() > 0 && observer_->wants_inputs(site.family, site.layer)) {
    observer_->on_inputs(c, inputs);
  }
}

const std::string* OpRunner::mark(OpSite site) const {
  if (observer_ == nullptr || !observer_->marks()) {
    return nullptr;
  }
  mark_ = op_scope_name(site.family, site.layer);
  return &mark_;
}

at::Tensor OpRunner::gemm(const at::Tensor& x, const at::Tensor& w, OpSite site) const {
  return policy_.emulates(site.family) ? emulated_split_k_linear(x, w, own_.cpu)
                                       : linear_call(x, w, own_.cpu);
}

at::Tensor OpRunner::linear(const at::Tensor& x, const at::Tensor& w, OpSite site) const {
  const compat::ProfilerScope scope(mark(site));
  if (observer_ != nullptr) {
    const std::int64_t k = x.size(-1);
    const std::int64_t m = k > 0 ? x.numel() / k : 0;
    const bool split = strategy(site) == Strategy::RowWise && rows_ > 1;
    const std::int64_t each = split ? m / rows_ : m;
    note(site, "linear", each, w.size(0), k, split ? rows_ : 1, x, gemm_path(x, each, site),
         {x, w});
  }
  if (strategy(site) == Strategy::BatchInvariant) {
    return invariant_gemm(x, w, site);
  }
  if (strategy(site) == Strategy::Batched || rows_ == 1) {
    return gemm(x, w, site);
  }
  return per_row_blocks(x, rows_, [&](const at::Tensor& part) { return gemm(part, w, site); });
}

at::Tensor OpRunner::linear_rows(const at::Tensor& x, const at::Tensor& w, const at::Tensor& row_of,
                                 OpSite site) const {
  const compat::ProfilerScope scope(mark(site));
  if (observer_ != nullptr) {
    // Row-wise: the rows of each logical row vary; the mean per call is reported.
    const bool split = strategy(site) == Strategy::RowWise && rows_ > 1;
    const std::int64_t each = split ? x.size(0) / rows_ : x.size(0);
    note(site, "linear", each, w.size(0), x.size(-1), split ? rows_ : 1, x,
         gemm_path(x, each, site), {x, w});
  }
  if (strategy(site) == Strategy::BatchInvariant) {
    return invariant_gemm(x, w, site);
  }
  if (strategy(site) == Strategy::Batched || rows_ == 1) {
    return gemm(x, w, site);
  }
  return per_row_gather(
      x, row_of, rows_,
      [&](const at::Tensor& part, std::int64_t, const at::Tensor&) { return gemm(part, w, site); });
}

at::Tensor OpRunner::matmul(const at::Tensor& a, const at::Tensor& b, OpSite site) const {
  const compat::ProfilerScope scope(mark(site));
  if (observer_ != nullptr) {
    const std::int64_t k = a.size(-1);
    const std::int64_t m = k > 0 ? a.numel() / k : 0;
    const bool split = strategy(site) == Strategy::RowWise && rows_ > 1;
    const std::int64_t each = split ? m / rows_ : m;
    std::string path = gemm_path(a, each, site);
    if (path == "at::linear") {
      path = "at::matmul";
    }
    note(site, "matmul", each, b.size(-1), k, split ? rows_ : 1, a, std::move(path), {a, b});
  }
  const auto call = [&](const at::Tensor& part) {
    // at::matmul(part, b) is F.linear(part, b.t()) bit for bit (both are one mm on ATen's side).
    return policy_.emulates(site.family)
               ? emulated_split_k_linear(part, b.t(), own_.cpu)
               : (own_.cpu.on ? linear_call(part, b.t(), own_.cpu) : at::matmul(part, b));
  };
  if (strategy(site) == Strategy::BatchInvariant) {
    return invariant_gemm(a, b.t(), site);
  }
  if (strategy(site) == Strategy::Batched || rows_ == 1) {
    return call(a);
  }
  return per_row_blocks(a, rows_, call);
}

at::Tensor OpRunner::attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& mask, double scale, bool is_causal,
                               bool enable_gqa, int layer) const {
  const OpSite site{OpFamily::Attention, layer};
  const compat::ProfilerScope scope(mark(site));
  if (observer_ != nullptr) {
    const bool split = strategy(site) == Strategy::RowWise && rows_ > 1;
    note(site, "sdpa", q.size(-2), k.size(-2), q.size(-1), split ? rows_ : 1, q,
         "at::scaled_dot_product_attention");
  }
  const auto call = [&](const at::Tensor& qq, const at::Tensor& kk, const at::Tensor& vv,
                        const at::Tensor& mm) {
    return compat::sdpa(qq, kk, vv, mm, scale, is_causal, enable_gqa);
  };
  // Batch-invariant attention is the batched call: attention kernels compute each batch
  // element on its own (no reduction across the batch dimension); the model's load-time check
  // measures it (DiffusionGemma::check_batch_invariance).
  if (strategy(OpSite{OpFamily::Attention, layer}) != Strategy::RowWise || rows_ == 1) {
    return call(q, k, v, mask);
  }
  std::vector<at::Tensor> parts;
  for (std::int64_t r = 0; r < rows_; ++r) {
    // A mask with a batch dim of B is sliced with its row; a broadcast mask is shared.
    const at::Tensor m =
        mask.defined() && mask.dim() == 4 && mask.size(0) == rows_ ? mask.narrow(0, r, 1) : mask;
    parts.push_back(call(q.narrow(0, r, 1), k.narrow(0, r, 1), v.narrow(0, r, 1), m));
  }
  return at::cat(parts, 0);
}

bool grouped_mm_available(const at::Device& device) {
#if BL_TORCH_HAS_GROUPED_MM
  return device.is_cuda();
#else
  (void)device;
  return false;
#endif
}

at::Tensor OpRunner::grouped_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offs,
                                const at::Tensor& row_of, OpSite site) const {
  const compat::ProfilerScope scope(mark(site));
  if (observer_ != nullptr) {
    const bool split = strategy(site) == Strategy::RowWise && rows_ > 1;
    const bool own = own_.experts && kernels::expert_gemm_fits(x, w, offs, own_.experts_rows);
    note(site, "grouped_mm", split ? x.size(0) / rows_ : x.size(0), w.size(-1), x.size(-1),
         split ? rows_ : 1, x,
         own ? "batchlens expert_gemm (at::_grouped_mm's bits)" : "at::_grouped_mm", {x, w, offs});
  }
#if BL_TORCH_HAS_GROUPED_MM
  const auto call = [this, &w](const at::Tensor& xx, const at::Tensor& oo) {
    if (own_.experts && kernels::expert_gemm_fits(xx, w, oo, own_.experts_rows)) {
      return kernels::expert_gemm(xx, w, oo, own_.experts_fold);
    }
    return compat::grouped_mm(xx, w, oo);
  };
  // Batch-invariant experts are the batched grouped GEMM: each group is one expert's rows and
  // its kernel reduces every output over K in one pass; the model's load-time check
  // (measure_batch_invariance) proves row 0 equal for B = 1..64 or the strategy is refused.
  if (strategy(site) != Strategy::RowWise || rows_ == 1) {
    return call(x, offs);
  }
  const std::int64_t experts = w.size(0);
  const at::Tensor ends = offs.to(at::kLong);  // [E] each expert's end in x
  const at::Tensor expert_ids = at::arange(experts, ends.options());
  // Each row has its tokens' top-k pairs: the same count for every row.
  return per_row_uniform(
      x, row_of, rows_, [&](const at::Tensor& part, std::int64_t, const at::Tensor& idx) {
        // This row's pairs are still sorted by expert: the expert of each, then each expert's end
        // within the row (how many of its pairs have an expert <= e), as the grouped GEMM's
        // offsets.
        const at::Tensor group = at::searchsorted(ends, idx, false, true);  // [n] int64, ascending
        return call(part, at::searchsorted(group, expert_ids, /*out_int32=*/true, /*right=*/true));
      });
#else
  (void)x, (void)w, (void)offs, (void)row_of, (void)site;
  base::raise(base::ErrorCode::InvalidArgument,
              "grouped_mm experts (batch of " + std::to_string(rows_) +
                  ") need LibTorch 2.8+ with CUDA; this build has LibTorch " +
                  compat::torch_version() + " - use the eager experts implementation");
#endif
}

}  // namespace batchlens::ops
