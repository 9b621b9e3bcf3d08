// SPDX-License-Identifier: Apache-2.0
// Stepping a group of generation engines together, one denoising step per tick: free (each
// engine its own trajectory) or lockstep (the followers decode the leader's input every step).
// Each engine keeps its row 0's per-tick record; the tensors of a tick stay on the device until
// the canvas ends (flush). Internal to core/experiment (LibTorch in the header).
#pragma once

#include <bitset>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/experiment/experiment.h"
#include "core/experiment/plan.h"
#include "core/generation/engine.h"
#include "core/probe/taps.h"

namespace batchlens::experiment {

/// Keeps this step's tapped tensors (clones: the model may reuse its buffers; a graph replay's
/// tap copies stay as they are until the next replay, and the comparisons that read them are
/// queued on the same stream before it).
class StepTaps final : public probe::TapSink {
 public:
  explicit StepTaps(std::bitset<probe::kTapCount> wanted) : wanted_(wanted) {}
  bool wants(probe::Tap tap, int /*layer*/) const override {
    return wanted_.test(static_cast<std::size_t>(tap));
  }
  /// The row under test is all the test-row comparisons read (-1: every row, for a batched
  /// lockstep run of identical rows, which also compares its rows).
  std::int64_t only_row() const override { return only_row_; }
  void set_only_row(std::int64_t row) { only_row_ = row; }
  void record(probe::Tap tap, int layer, const at::Tensor& value) override;
  void record_stable(probe::Tap tap, int layer, const at::Tensor& value) override;
  /// The tensor recorded this step, undefined when none was.
  at::Tensor get(probe::Tap tap, int layer) const;
  void clear() { taps_.clear(); }

 private:
  std::bitset<probe::kTapCount> wanted_;
  std::int64_t only_row_ = -1;
  std::map<std::pair<probe::Tap, int>, at::Tensor> taps_;
};

/// What one run's rows hold: the prompt in every row, or a mixed batch (issue #35) with the
/// prompt under test in row `row` and other prompts beside it.
struct RunRows {
  const at::Tensor* prompt = nullptr;                ///< [1, L] int64: identical rows
  const generation::PaddedPrompts* mixed = nullptr;  ///< else the padded batch
  std::int64_t row = 0;                              ///< the row under test
};

/// One run: its generation engine, this tick's taps and step, and the per-tick record of the
/// row under test (row 0 unless a mixed batch puts the prompt elsewhere).
class Engine {
 public:
  /// Builds the engine of `run` (prefill included). `options` carries everything but the batch
  /// size and the policy, which come from `run`.
  Engine(const PlannedRun& run, const model::DiffusionGemma& model, const RunRows& rows,
         generation::GenerateOptions options, Layout layout, bool lockstep);

  generation::GenerationEngine& engine() { return *engine_; }
  const generation::GenerationEngine& engine() const { return *engine_; }
  const RunResult& result() const { return result_; }
  const StepTaps& taps() const { return taps_; }
  bool stepped() const { return stepped_; }
  double seconds() const { return seconds_; }
  /// The row under test in this engine's tap tensors (0 where they keep that row only).
  std::int64_t tap_row() const { return taps_.only_row() >= 0 ? 0 : row_; }
  /// Where a lockstep follower takes the leader's state: the row under test of a mixed batch,
  /// every row (-1) of identical ones.
  std::int64_t adopt_row() const { return mixed_ ? row_ : -1; }
  /// Row 0's record so far, [ticks * C] each (a canvas's ticks filled in by flush()).
  const std::vector<std::int64_t>& canvas_in() const { return canvas_in_; }
  const std::vector<std::int64_t>& argmax() const { return argmax_; }
  const std::vector<std::int64_t>& sampled() const { return sampled_; }
  const std::vector<std::uint8_t>& accepted() const { return accepted_; }

  /// Starts a tick: forgets the last one's taps.
  void clear_tick();
  /// One denoising step with the taps recorded (timed).
  void step();
  /// Runs `f` and adds its time to this engine's.
  template <class F>
  void timed(F&& f);

  /// Appends this tick to row 0's record: the step's tensors, queued on the device, or "did not
  /// step" values.
  void record_tick();
  /// Reads the canvas's queued ticks back in one transfer.
  void flush();
  /// The run's result after `ticks` ticks: row 0's record, tokens, text (`decode`), time.
  template <class Decode>
  RunResult finish(std::int64_t ticks, Decode&& decode);

 private:
  RunResult result_;
  Layout layout_;
  ops::OpPolicy policy_;  // the engine points at it: an Engine is never moved
  StepTaps taps_;
  std::unique_ptr<generation::GenerationEngine> engine_;
  generation::StepTensors last_;  // this tick's step (when stepped)
  std::int64_t row_ = 0;          // the row under test
  bool mixed_ = false;            // a batch of different prompts
  bool stepped_ = false;          // in the current tick
  double seconds_ = 0;
  // Row-0 per-tick data, appended; a stepped tick's values arrive at the end of the canvas.
  std::vector<std::int64_t> canvas_in_, argmax_, sampled_;
  std::vector<std::uint8_t> accepted_;
  std::vector<float> entropy_;
  // Per stepped tick: where its values go, and [5, C] fp64 on the device (canvas_in, argmax,
  // sampled, accepted, entropy: exact in fp64).
  std::vector<std::pair<std::size_t, at::Tensor>> pending_;
};

/// Steps a group's engines together. engines[0] leads: in lockstep mode the others decode its
/// input of every step (adopt) and step only when it does.
class GroupStepper {
 public:
  GroupStepper(std::vector<Engine*> engines, RunMode mode);

  /// Every engine has generated all its canvases.
  bool done() const;
  /// Starts the next canvas of every engine that has one.
  void begin_canvas();
  /// One tick: every engine that may step takes one denoising step. False when none did (the
  /// canvas is over).
  bool tick();
  /// Commits the canvas of every engine still generating.
  void end_canvas();
  Engine& leader() { return *engines_.front(); }

 private:
  std::vector<Engine*> engines_;
  bool lockstep_ = false;
};

// ---- implementation of the templates

template <class F>
void Engine::timed(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <class Decode>
RunResult Engine::finish(std::int64_t ticks, Decode&& decode) {
  RunResult r = std::move(result_);
  const std::vector<std::int64_t> shape{ticks, layout_.c};
  r.canvas_in = NdArray<std::int64_t>::of(shape, std::move(canvas_in_));
  r.argmax = NdArray<std::int64_t>::of(shape, std::move(argmax_));
  r.sampled = NdArray<std::int64_t>::of(shape, std::move(sampled_));
  r.accepted = NdArray<std::uint8_t>::of(shape, std::move(accepted_));
  r.entropy = NdArray<float>::of(shape, std::move(entropy_));
  const generation::GenerationResult g = engine_->result();
  const generation::RowOutcome& row = g.rows.at(static_cast<std::size_t>(row_));
  r.tokens = row.tokens;
  r.stop_position = row.stop_position;
  r.steps = row.steps;
  r.text = decode(r.tokens, r.stop_position);
  r.wall_time_s = seconds_;
  return r;
}

}  // namespace batchlens::experiment
