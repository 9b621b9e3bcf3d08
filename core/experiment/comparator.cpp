// SPDX-License-Identifier: Apache-2.0
#include "core/experiment/comparator.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include <ATen/ATen.h>

#include "core/experiment/divergence.h"
#include "core/probe/metrics.h"
#include "core/text/token_diff.h"

namespace batchlens::experiment {

namespace {

using probe::Tap;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The row under test of the tap of each layer, stacked (a copy of that row only): [n, C, ...].
at::Tensor stack_test_row(const StepTaps& taps, Tap tap, int layers, std::int64_t row) {
  std::vector<at::Tensor> rows;
  rows.reserve(static_cast<std::size_t>(layers));
  for (int l = 0; l < layers; ++l) {
    rows.push_back(taps.get(tap, l).select(0, row));
  }
  return at::stack(rows);
}

// The (slot, tap index) cells whose tap both sinks recorded this tick, in tap then layer order,
// with the tensors to compare; `pick` maps a recorded tensor to the compared one.
template <class Pick>
void tapped_pairs(const StepTaps& ref, const StepTaps& run, const Layout& lay, Pick&& pick,
                  std::vector<probe::TapRow>& xs, std::vector<probe::TapRow>& ys,
                  std::vector<std::pair<std::int64_t, std::int64_t>>& where) {
  for (std::size_t t = 0; t < lay.taps.size(); ++t) {
    const Tap tap = lay.taps[t];
    const bool per_layer = probe::tap_is_per_layer(tap);
    for (int l = per_layer ? 0 : probe::kNoLayer; l < (per_layer ? lay.layers : 0); ++l) {
      const at::Tensor x = ref.get(tap, l);
      const at::Tensor y = run.get(tap, l);
      if (!x.defined() || !y.defined()) {
        continue;
      }
      pick(x, y, xs, ys);
      where.emplace_back(l == probe::kNoLayer ? lay.layers : l, static_cast<std::int64_t>(t));
    }
  }
}

float max_of(const float* begin, const float* end) {
  return std::accumulate(begin, end, 0.0F, [](float m, float v) { return std::max(m, v); });
}

}  // namespace

Comparator::Comparator(const PlannedComparison& planned, const Engine& reference, const Engine& run,
                       Layout layout, bool diff_kernel)
    : ref_(&reference), run_(&run), lay_(std::move(layout)), diff_kernel_(diff_kernel) {
  r_.id = planned.id;
  r_.kind = planned.kind;
  r_.reference = reference.result().id;
  r_.run = run.result().id;
}

void Comparator::queue_tick() {
  if (r_.kind == ComparisonKind::Rows) {
    queue_rows(run_->stepped());
  } else {
    queue_row0(ref_->stepped() && run_->stepped());
  }
}

// Appends one tick of NaN aggregates [L+1, T]; returns where the tick starts.
std::size_t Comparator::grow_aggregates() {
  const std::size_t base = frac_.size();
  frac_.resize(base + static_cast<std::size_t>((lay_.layers + 1) * lay_.taps.size()), kNaN);
  abs_.resize(frac_.size(), kNaN);
  ulp_.resize(frac_.size(), kNaN);
  return base;
}

// One tick of row-0 comparison (or an uncompared tick): the kernels run on the tensors' device.
void Comparator::queue_row0(bool both) {
  const std::int64_t slots = lay_.layers + 1;
  const auto ntap = static_cast<std::int64_t>(lay_.taps.size());
  PendingTick p;
  p.base = grow_aggregates();
  p.pbase = pos_.size();
  pos_.resize(p.pbase + static_cast<std::size_t>(slots * ntap * lay_.c), kNaN);
  pos_abs_.resize(pos_.size(), kNaN);
  pos_ulp_.resize(pos_.size(), kNaN);
  p.lbase = flips_.size();
  flips_.resize(p.lbase + static_cast<std::size_t>(lay_.layers * lay_.c), 0);
  margin_.resize(flips_.size(), kNaN);
  p.sbase = sampler_.size();
  sampler_.resize(p.sbase + static_cast<std::size_t>(lay_.c), 0);
  r_.compared.push_back(both ? 1 : 0);
  if (!both) {
    return;
  }
  // Every tapped tensor of this tick, all layers and taps, in one launch.
  std::vector<probe::TapRow> xs;
  std::vector<probe::TapRow> ys;
  tapped_pairs(
      ref_->taps(), run_->taps(), lay_,
      [&](const at::Tensor& x, const at::Tensor& y, auto& xv, auto& yv) {
        xv.push_back({x, ref_->tap_row()});
        yv.push_back({y, run_->tap_row()});
      },
      xs, ys, p.where);
  if (!xs.empty()) {
    p.diff = probe::position_diffs(xs, ys, diff_kernel_);  // [n, 3, C]
  }
  if (ref_->taps().get(Tap::RouterTopkIds, 0).defined()) {
    bool scores = true;
    for (int l = 0; l < lay_.layers; ++l) {
      scores = scores && ref_->taps().get(Tap::RouterScores, l).defined();
    }
    p.ids_ref = stack_test_row(ref_->taps(), Tap::RouterTopkIds, lay_.layers, ref_->tap_row());
    p.ids_run = stack_test_row(run_->taps(), Tap::RouterTopkIds, lay_.layers, run_->tap_row());
    if (scores) {
      p.scores = stack_test_row(ref_->taps(), Tap::RouterScores, lay_.layers, ref_->tap_row());
    }
  }
  p.sampler = true;
  pending_.push_back(std::move(p));
}

// Rows 1.. of a batched run vs its own row 0 (aggregates only).
void Comparator::queue_rows(bool stepped) {
  PendingTick p;
  p.base = grow_aggregates();
  r_.compared.push_back(stepped ? 1 : 0);
  if (!stepped) {
    return;
  }
  std::vector<probe::TapRow> xs;
  std::vector<probe::TapRow> ys;
  std::int64_t others = 0;
  tapped_pairs(
      run_->taps(), run_->taps(), lay_,
      [&others](const at::Tensor& x, const at::Tensor& /*y*/, auto& xv, auto& yv) {
        // Rows 1.. against row 0, as extra pairs: [B - 1] pairs per cell (every tap of a run
        // has its batch size B as the first dimension).
        const std::int64_t b = x.size(0);
        TORCH_CHECK(others == 0 || others == b - 1, "compare rows: taps of one run with ",
                    others + 1, " and ", b, " rows");
        others = b - 1;
        for (std::int64_t r = 1; r < b; ++r) {
          xv.push_back({x, 0});
          yv.push_back({x, r});
        }
      },
      xs, ys, p.where);
  if (xs.empty() || others < 1) {
    return;
  }
  const auto n = static_cast<std::int64_t>(p.where.size());
  // [n, 3, (B-1) * C]: each cell's rows and positions in order, reduced as contiguous rows.
  const at::Tensor d = probe::position_diffs(xs, ys, diff_kernel_)
                           .view({n, others, 3, lay_.c})
                           .permute({0, 2, 1, 3})
                           .reshape({n, 3, -1});
  p.diff = at::stack({d.select(1, 0).mean(1), d.select(1, 1).amax(1), d.select(1, 2).amax(1)},
                     1);  // [n, 3]
  pending_.push_back(std::move(p));
}

// Routing of the queued ticks, for all of them at once: flips [ticks with ids, L, C] and the
// reference's margins [ticks with scores, L, C], fp32 on the host.
std::pair<at::Tensor, at::Tensor> Comparator::routing() const {
  std::vector<at::Tensor> ref;
  std::vector<at::Tensor> run;
  std::vector<at::Tensor> scores;
  for (const PendingTick& p : pending_) {
    if (p.ids_ref.defined()) {
      ref.push_back(p.ids_ref);
      run.push_back(p.ids_run);
    }
    if (p.scores.defined()) {
      scores.push_back(p.scores);
    }
  }
  at::Tensor flips;
  at::Tensor margins;
  if (!ref.empty()) {
    flips = probe::routing_flips(at::cat(ref), at::cat(run)).to(at::kFloat).cpu().contiguous();
  }
  if (!scores.empty()) {
    const at::Tensor all = at::cat(scores);  // [ticks * L, C, E]
    margins =
        probe::router_margin(all.reshape({all.size(0) * lay_.c, -1}), lay_.k).cpu().contiguous();
  }
  return {flips, margins};
}

// One tick's diff rows (`d`: its part of the read-back tensor) into the host arrays.
void Comparator::unpack_diff(const PendingTick& p, const float* d) {
  const auto ntap = static_cast<std::int64_t>(lay_.taps.size());
  const auto c = static_cast<std::size_t>(lay_.c);
  const bool rows = p.diff.dim() == 2;  // [n, 3] aggregates, else [n, 3, C]
  for (std::size_t i = 0; i < p.where.size(); ++i) {
    const auto [slot, t] = p.where[i];
    const std::size_t cell = p.base + static_cast<std::size_t>(slot * ntap + t);
    if (rows) {
      frac_[cell] = d[3 * i];
      abs_[cell] = d[3 * i + 1];
      ulp_[cell] = d[3 * i + 2];
      continue;
    }
    const float* f = d + 3 * c * i;
    const std::size_t at = p.pbase + static_cast<std::size_t>(slot * ntap + t) * c;
    std::copy(f, f + c, pos_.begin() + static_cast<std::ptrdiff_t>(at));
    std::copy(f + c, f + 2 * c, pos_abs_.begin() + static_cast<std::ptrdiff_t>(at));
    std::copy(f + 2 * c, f + 3 * c, pos_ulp_.begin() + static_cast<std::ptrdiff_t>(at));
    frac_[cell] = std::accumulate(f, f + c, 0.0F) / static_cast<float>(lay_.c);
    abs_[cell] = max_of(f + c, f + 2 * c);
    ulp_[cell] = max_of(f + 2 * c, f + 3 * c);
  }
}

// The tick's row-0 decisions of both engines sit at the same place in their records.
void Comparator::unpack_sampler(const PendingTick& p) {
  const Engine& x = *ref_;
  const Engine& y = *run_;
  for (std::size_t e = p.sbase; e < p.sbase + static_cast<std::size_t>(lay_.c); ++e) {
    sampler_[e] =
        static_cast<std::uint8_t>((x.canvas_in()[e] != y.canvas_in()[e] ? CanvasInDiffers : 0) |
                                  (x.sampled()[e] != y.sampled()[e] ? SampledDiffers : 0) |
                                  (x.argmax()[e] != y.argmax()[e] ? ArgmaxDiffers : 0) |
                                  (x.accepted()[e] != y.accepted()[e] ? AcceptedDiffers : 0));
  }
}

void Comparator::flush() {
  if (pending_.empty()) {
    return;
  }
  std::vector<at::Tensor> parts;
  for (const PendingTick& p : pending_) {
    if (p.diff.defined()) {
      parts.push_back(p.diff.reshape({-1}));
    }
  }
  const at::Tensor diff = parts.empty() ? at::Tensor() : at::cat(parts).cpu().contiguous();
  const auto [flips, margins] = routing();
  const std::size_t lc = static_cast<std::size_t>(lay_.layers) * static_cast<std::size_t>(lay_.c);
  std::size_t di = 0;
  std::size_t fi = 0;
  std::size_t mi = 0;
  for (const PendingTick& p : pending_) {
    if (p.diff.defined()) {
      unpack_diff(p, diff.data_ptr<float>() + di);
      di += static_cast<std::size_t>(p.diff.numel());
    }
    if (p.sampler) {
      unpack_sampler(p);
    }
    if (p.ids_ref.defined()) {
      const float* f = flips.data_ptr<float>() + fi;
      for (std::size_t i = 0; i < lc; ++i) {
        flips_[p.lbase + i] = f[i] > 0 ? 1 : 0;
      }
      fi += lc;
    }
    if (p.scores.defined()) {
      std::copy(margins.data_ptr<float>() + mi, margins.data_ptr<float>() + mi + lc,
                margin_.begin() + static_cast<std::ptrdiff_t>(p.lbase));
      mi += lc;
    }
  }
  pending_.clear();
}

bool Comparator::differs_so_far() const {
  if (r_.kind != ComparisonKind::Row0) {
    return false;
  }
  const auto positive = [](float v) {
    return v > 0;
  };  // NaN: not compared
  return std::any_of(frac_.begin(), frac_.end(), positive) ||
         std::any_of(sampler_.begin(), sampler_.end(), [](std::uint8_t v) { return v != 0; });
}

ComparisonResult Comparator::finish(std::int64_t ticks, const std::vector<std::string>& tap_names,
                                    const RunResult& ref, const RunResult& run) {
  ComparisonResult c = std::move(r_);
  const std::int64_t s = ticks;
  const std::int64_t slots = lay_.layers + 1;
  const auto ntap = static_cast<std::int64_t>(lay_.taps.size());
  c.frac_differ = NdArray<float>::of({s, slots, ntap}, std::move(frac_));
  c.max_abs = NdArray<float>::of({s, slots, ntap}, std::move(abs_));
  c.max_ulp = NdArray<float>::of({s, slots, ntap}, std::move(ulp_));
  if (c.kind == ComparisonKind::Row0) {
    c.pos_frac_differ = NdArray<float>::of({s, slots, ntap, lay_.c}, std::move(pos_));
    c.pos_max_abs = NdArray<float>::of({s, slots, ntap, lay_.c}, std::move(pos_abs_));
    c.pos_max_ulp = NdArray<float>::of({s, slots, ntap, lay_.c}, std::move(pos_ulp_));
    c.routing_flips = NdArray<std::uint8_t>::of({s, lay_.layers, lay_.c}, std::move(flips_));
    c.router_margin = NdArray<float>::of({s, lay_.layers, lay_.c}, std::move(margin_));
    c.sampler_diff = NdArray<std::uint8_t>::of({s, lay_.c}, std::move(sampler_));
    c.token_diff = text::token_diff(ref.tokens, run.tokens);
    c.tokens_changed = text::changed_count(c.token_diff);
    c.tokens_identical = c.tokens_changed == 0;
    c.stop_changed = ref.stop_position != run.stop_position;
    c.steps_changed = ref.steps != run.steps;
  }
  c.first = first_divergence(c, lay_, tap_names, ref);
  return c;
}

}  // namespace batchlens::experiment
