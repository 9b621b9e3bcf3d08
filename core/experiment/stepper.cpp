// SPDX-License-Identifier: Apache-2.0
#include "core/experiment/stepper.h"

#include <algorithm>
#include <limits>

#include <ATen/ATen.h>

#include "core/base/input.h"

namespace batchlens::experiment {

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::bitset<probe::kTapCount> wanted_taps(const Layout& layout) {
  std::bitset<probe::kTapCount> wanted;
  for (const probe::Tap t : layout.taps) {
    wanted.set(static_cast<std::size_t>(t));
  }
  return wanted;
}

}  // namespace

void StepTaps::record(probe::Tap tap, int layer, const at::Tensor& value) {
  const bool one = only_row_ >= 0 && value.dim() > 0;
  taps_[{tap, layer}] = (one ? value.narrow(0, only_row_, 1) : value).detach().clone();
}

void StepTaps::record_stable(probe::Tap tap, int layer, const at::Tensor& value) {
  taps_[{tap, layer}] = value.detach();
}

at::Tensor StepTaps::get(probe::Tap tap, int layer) const {
  const auto it = taps_.find({tap, layer});
  return it == taps_.end() ? at::Tensor() : it->second;
}

Engine::Engine(const PlannedRun& run, const model::DiffusionGemma& model, const RunRows& rows,
               generation::GenerateOptions options, Layout layout, bool lockstep)
    : layout_(std::move(layout)), policy_(run.policy), taps_(wanted_taps(layout_)) {
  mixed_ = rows.mixed != nullptr && run.batch_size > 1;
  row_ = run.batch_size > 1 ? rows.row : 0;
  if (row_ < 0 || row_ >= run.batch_size) {
    base::raise(
        base::ErrorCode::InvalidArgument,
        "row " + std::to_string(row_) + " is outside a batch of " + std::to_string(run.batch_size));
  }
  // A lockstep batch of identical rows also compares its rows with each other: every row kept.
  taps_.set_only_row(lockstep && run.batch_size > 1 && !mixed_ ? -1 : row_);
  result_.id = run.id;
  result_.batch_size = run.batch_size;
  result_.group = run.group;
  result_.policy_json = base::dump_json_lossy(ops::to_json(policy_));
  result_.policy_text = ops::describe(policy_);
  result_.emulated = policy_.emulate_split_k.any();
  options.batch_size = run.batch_size;
  options.policy = &policy_;
  options.lead_row = row_;  // the row under test draws the reference's noise
  const generation::PaddedPrompts* mixed = mixed_ ? rows.mixed : nullptr;
  if (mixed == nullptr && rows.prompt == nullptr) {
    base::raise(base::ErrorCode::Internal, "a run without a prompt");
  }
  timed([&] {
    engine_ = mixed != nullptr
                  ? std::make_unique<generation::GenerationEngine>(model, *mixed, options)
                  : std::make_unique<generation::GenerationEngine>(model, *rows.prompt, options);
  });
}

void Engine::clear_tick() {
  stepped_ = false;
  taps_.clear();
}

void Engine::step() {
  timed([&] { last_ = engine_->step(&taps_); });
  stepped_ = true;
}

void Engine::record_tick() {
  const auto c = static_cast<std::size_t>(layout_.c);
  result_.tick_canvas.push_back(stepped_ ? engine_->canvas() : -1);
  result_.tick_step.push_back(stepped_ ? engine_->step_index() : -1);
  if (!stepped_) {
    canvas_in_.insert(canvas_in_.end(), c, -1);
    argmax_.insert(argmax_.end(), c, -1);
    sampled_.insert(sampled_.end(), c, -1);
    accepted_.insert(accepted_.end(), c, 0);
    entropy_.insert(entropy_.end(), c, kNaN);
    return;
  }
  const generation::StepTensors& l = last_;
  pending_.emplace_back(
      canvas_in_.size(),
      at::stack({l.canvas_in.to(at::kDouble), l.argmax.to(at::kDouble), l.sampled.to(at::kDouble),
                 l.accepted.to(at::kDouble), l.entropy.to(at::kDouble)})
          .select(1, row_));
  canvas_in_.resize(canvas_in_.size() + c);
  argmax_.resize(argmax_.size() + c);
  sampled_.resize(sampled_.size() + c);
  accepted_.resize(accepted_.size() + c);
  entropy_.resize(entropy_.size() + c);
}

void Engine::flush() {
  if (pending_.empty()) {
    return;
  }
  std::vector<at::Tensor> parts;
  parts.reserve(pending_.size());
  for (const auto& [at, t] : pending_) {
    parts.push_back(t);
  }
  const at::Tensor all = at::stack(parts).cpu().contiguous();  // [ticks, 5, C] fp64
  const double* v = all.data_ptr<double>();
  const auto c = static_cast<std::size_t>(layout_.c);
  for (const auto& [at, t] : pending_) {
    for (std::size_t p = 0; p < c; ++p) {
      canvas_in_[at + p] = static_cast<std::int64_t>(v[p]);
      argmax_[at + p] = static_cast<std::int64_t>(v[c + p]);
      sampled_[at + p] = static_cast<std::int64_t>(v[2 * c + p]);
      accepted_[at + p] = v[3 * c + p] != 0 ? 1 : 0;
      entropy_[at + p] = static_cast<float>(v[4 * c + p]);
    }
    v += 5 * c;
  }
  pending_.clear();
}

GroupStepper::GroupStepper(std::vector<Engine*> engines, RunMode mode)
    : engines_(std::move(engines)), lockstep_(mode == RunMode::Lockstep) {}

bool GroupStepper::done() const {
  return std::all_of(engines_.begin(), engines_.end(),
                     [](const Engine* e) { return e->engine().done(); });
}

void GroupStepper::begin_canvas() {
  for (Engine* e : engines_) {
    if (!e->engine().done()) {
      e->timed([&] { e->engine().begin_canvas(); });
    }
  }
}

bool GroupStepper::tick() {
  Engine& lead = leader();
  bool any = false;
  for (Engine* e : engines_) {
    e->clear_tick();
    if (e == &lead) {
      const generation::DenoiserState pre = lead.engine().snapshot();
      if (!lead.engine().done() && !lead.engine().canvas_done()) {
        lead.step();
        any = true;
      }
      // Followers in lockstep decode the leader's input of this step.
      for (Engine* f : engines_) {
        if (lockstep_ && f != &lead && lead.stepped() && !f->engine().done()) {
          f->engine().adopt(pre, f->adopt_row());
        }
      }
      continue;
    }
    const bool follows = lockstep_;
    const bool can = !e->engine().done() && (follows ? !lead.engine().done() && lead.stepped()
                                                     : !e->engine().canvas_done());
    if (!can) {
      continue;
    }
    e->step();
    any = true;
    if (follows) {
      e->engine().adopt(lead.engine().snapshot(), e->adopt_row());
    }
  }
  return any;
}

void GroupStepper::end_canvas() {
  Engine& lead = leader();
  for (Engine* e : engines_) {
    if (!e->engine().done()) {
      if (lockstep_ && e != &lead) {
        e->engine().adopt(lead.engine().snapshot(), e->adopt_row());
      }
      e->timed([&] { e->engine().end_canvas(); });
    }
  }
}

}  // namespace batchlens::experiment
