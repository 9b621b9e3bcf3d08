// SPDX-License-Identifier: Apache-2.0
// Taps: named intermediate tensors the model offers per layer and step (attention, MLP, router,
// self-conditioning, logits), recorded only when a sink asks for them.
#pragma once

#include <bitset>
#include <cstdint>
#include <functional>
#include <map>
#include <utility>

#include <ATen/core/Tensor.h>

#include "core/probe/tap_names.h"

namespace batchlens::probe {

/// Receives tapped tensors from the model. The model asks wants() first and only then builds
/// and records the tensor, so an unobserved tap costs nothing (ref: llama.cpp's two-phase
/// `cb_eval` "ask" callback). Called on the thread running the model; the tensor may be a view
/// that the model overwrites later: copy it if it must outlive the call.
class TapSink {
 public:
  TapSink() = default;
  TapSink(const TapSink&) = delete;
  TapSink& operator=(const TapSink&) = delete;
  TapSink(TapSink&&) = delete;
  TapSink& operator=(TapSink&&) = delete;
  virtual ~TapSink() = default;

  /// Does anyone want `tap` of `layer` (kNoLayer for per-step taps) in the current forward?
  virtual bool wants(Tap tap, int layer) const = 0;
  /// The tensor for `tap` of `layer`. Shapes are listed with the Tap enum.
  virtual void record(Tap tap, int layer, const at::Tensor& value) = 0;
  /// The one row (batch index) of each tap that is of interest, or -1 for every row: the model
  /// still records whole tensors, but a copy made on the sink's behalf (a CUDA graph's) may keep
  /// that row only. (Row 0 unless a mixed batch holds the prompt under test elsewhere.)
  virtual std::int64_t only_row() const { return -1; }
  /// Like record(), for a tensor nobody writes to before the next forward (a CUDA graph's tap
  /// copy, rewritten only by the next replay): a sink that reads it before then, or queues
  /// work on it in stream order, may keep it without copying. By default, record().
  virtual void record_stable(Tap tap, int layer, const at::Tensor& value) {
    record(tap, layer, value);
  }
};

/// A TapSink that keeps copies of a chosen set of taps, for every layer, in a map.
/// For tests, `batchlens-cli forward` and parity checks. Not thread-safe.
class TapRecorder final : public TapSink {
 public:
  /// Records the given taps; an empty set records none.
  explicit TapRecorder(std::bitset<kTapCount> taps) : taps_(taps) {}
  /// Records every tap.
  static TapRecorder all() { return TapRecorder(std::bitset<kTapCount>().set()); }

  bool wants(Tap tap, int /*layer*/) const override {
    return taps_.test(static_cast<std::size_t>(tap));
  }
  void record(Tap tap, int layer, const at::Tensor& value) override;

  /// Recorded tensors by (tap, layer), detached copies.
  const std::map<std::pair<Tap, int>, at::Tensor>& recorded() const { return recorded_; }
  /// One recorded tensor; undefined Tensor when absent.
  at::Tensor get(Tap tap, int layer = kNoLayer) const;
  void clear() { recorded_.clear(); }

 private:
  std::bitset<kTapCount> taps_;
  std::map<std::pair<Tap, int>, at::Tensor> recorded_;
};

}  // namespace batchlens::probe
