// SPDX-License-Identifier: Apache-2.0
// Block-diffusion generation: DiffusionGemmaGenerationMixin.generate ported to LibTorch, with
// per-row random streams (or the reference's shared stream) and a per-step record.
#pragma once

#include <cstdint>
#include <functional>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/base/cancel.h"
#include "core/compat/device_graph.h"
#include "core/generation/sampler.h"
#include "core/model/diffusion_gemma.h"
#include "core/ops/policy.h"
#include "core/probe/taps.h"

namespace batchlens::generation {

/// One denoising step of one canvas, for every row (tensors on the CPU).
struct StepRecord {
  int canvas = 0;         ///< canvas index, 0-based
  int step = 0;           ///< steps done in this canvas, 1-based
  int cur_step = 0;       ///< the reference's countdown N .. 1
  float temperature = 0;  ///< the step's temperature (fp32)
  at::Tensor canvas_in;   ///< [B, C] int64 the decoder's input canvas
  at::Tensor sampled;     ///< [B, C] int64 multinomial draws
  at::Tensor argmax;      ///< [B, C] int64 argmax of the processed logits
  at::Tensor accepted;    ///< [B, C] bool  entropy-bound acceptance
  at::Tensor entropy;     ///< [B, C] fp32  entropy of the processed logits
  at::Tensor finished;    ///< [B] bool     rows whose denoising has stopped
  /// [B, C, V] the decoder's raw logits on the host, at each canvas's first step only, and
  /// only with GenerateOptions::record_first_logits (tools/parity's bitwise check).
  at::Tensor logits;
};

/// Called after every denoising step; may return false to cancel.
using StepObserver = std::function<void(const StepRecord&)>;

/// A batch of different prompts, left-padded to the longest as transformers' tokenizer
/// (padding_side="left") and inference servers build it (issue #35).
struct PaddedPrompts {
  at::Tensor ids;                     ///< [B, L] int64, pad_token_id left of shorter rows
  at::Tensor valid;                   ///< [B, L] bool: the real tokens
  std::vector<std::int64_t> lengths;  ///< real tokens per row
};

/// The prompts of a batch of `batch_size` rows with companions (issue #35): `prompt` in row
/// `row`, the companions cycled over the other rows in order. Empty companions: `prompt` in
/// every row.
std::vector<std::vector<std::int64_t>> batch_rows(
    const std::vector<std::int64_t>& prompt,
    const std::vector<std::vector<std::int64_t>>& companions, std::int64_t batch_size,
    std::int64_t row);

/// `rows` (each at least one token) left-padded with `pad_id`. InvalidArgument on no rows or
/// an empty row.
PaddedPrompts pad_left(const std::vector<std::vector<std::int64_t>>& rows, std::int64_t pad_id);

/// The prefill's token layout of a padded batch on `device`: its padding mask, and for PerRow
/// each row's positions counting its real tokens (padding slots 0, never attended to); Shared
/// leaves positions to the model (transformers' one set from the padded length). ref: generate's
/// attention_mask and position ids for a left-padded input_ids
model::TokenLayout prefill_layout(const PaddedPrompts& prompts, PositionMode positions,
                                  const at::Device& device);
/// Canvas `canvas`'s position ids [B, C] for PerRow in a padded batch (each row's real length
/// plus the canvases before); undefined (the model's shared default) otherwise.
at::Tensor canvas_positions(const PaddedPrompts& prompts, PositionMode positions, int canvas,
                            std::int64_t canvas_length, const at::Device& device);

/// Everything a generation run needs besides the model and the prompt.
struct GenerateOptions {
  std::int64_t batch_size = 1;
  std::uint64_t seed = 0;
  RngMode rng = RngMode::PerRow;
  PrefillMode prefill = PrefillMode::Copied;
  /// A batch of different prompts: the rows' position ids (identical rows: no effect).
  PositionMode positions = PositionMode::Shared;
  /// Per-row streams: the row that draws row 0's stream (RandomStreams' lead_row). A mixed
  /// batch's row under test, so that the sampler is not a cause.
  std::int64_t lead_row = 0;
  GenerationConfig config;
  const ops::OpPolicy* policy = nullptr;      ///< null = default
  const base::CancelToken* cancel = nullptr;  ///< checked before every step
  StepObserver on_step;                       ///< optional
  /// on_step's StepRecord::logits at each canvas's first step (a host copy of [B, C, V]).
  bool record_first_logits = false;
  /// On CUDA, the decoder pass of each step with self-conditioning replays a CUDA graph captured
  /// once per canvas, tap copies included (the same kernels, so the same bits: the first replay
  /// of each capture is checked bitwise against the eager pass, and graphs are dropped for good
  /// if it differs or capture fails).
  /// Callers set it from base::Switches::cuda_graphs (BATCHLENS_CUDA_GRAPHS=0 at the edge).
  bool cuda_graph = true;
  /// Hears of every op call of the engine's passes (prefill, commits, steps): the minimal
  /// repro's capture (experiment/repro.h). Set, the engine runs every step eager (cuda_graph
  /// is ignored), so the observer sees each call as it runs.
  ops::OpObserver* observer = nullptr;
};

/// What one row produced.
struct RowOutcome {
  /// Generated tokens: every canvas up to the one holding its EOS (as the row alone generates
  /// them; the batch's later canvases, pads for this row, are not its output), pads after EOS.
  std::vector<std::int64_t> tokens;
  std::int64_t stop_position = -1;  ///< index of the first EOS in `tokens`, -1 without one
  std::vector<int> steps;           ///< denoising steps taken per canvas (as tokens)
};

struct GenerationResult {
  at::Tensor sequences;          ///< [B, L + canvases * C] int64 CPU: prompt + canvases
  std::vector<RowOutcome> rows;  ///< one per row
  int canvases = 0;
};

/// The device tensors of one denoising step of one engine (all rows), before copying.
struct StepTensors {
  at::Tensor canvas_in;  ///< [B, C] int64
  at::Tensor sampled;    ///< [B, C] int64
  at::Tensor argmax;     ///< [B, C] int64
  at::Tensor accepted;   ///< [B, C] bool
  at::Tensor entropy;    ///< [B, C] fp32
  at::Tensor finished;   ///< [B] bool
  float temperature = 0;
  /// [B, C, V] the decoder's raw logits (the model's output dtype), at a canvas's first step
  /// with GenerateOptions::record_first_logits only; undefined otherwise.
  at::Tensor logits;
};

/// Row 0's denoising state, for lockstep runs (see GenerationEngine::adopt).
struct DenoiserState {
  at::Tensor current;    ///< [1, C] int64
  at::Tensor argmax;     ///< [1, C] int64
  at::Tensor sc_logits;  ///< [1, C, V] model dtype; undefined before the first step
  at::Tensor finished;   ///< [1] bool
};

/// generate() taken apart so that several engines (batch sizes, policies) can be stepped
/// together: the constructor prefills; then per canvas begin_canvas(), step() until
/// canvas_done(), end_canvas(); until done(). Throws as generate().
class GenerationEngine {
 public:
  /// options.batch_size identical rows of `prompt` [1, L].
  GenerationEngine(const model::DiffusionGemma& model, const at::Tensor& prompt,
                   const GenerateOptions& options);
  /// A batch of different prompts (options.batch_size rows), prefilled as one batch, padding
  /// masked and positioned by options.positions. ref: generate with a left-padded input_ids and
  /// its attention_mask
  GenerationEngine(const model::DiffusionGemma& model, const PaddedPrompts& prompts,
                   const GenerateOptions& options);

  bool done() const { return done_; }
  /// The current canvas stopped denoising (every row finished or the steps ran out).
  bool canvas_done() const;
  /// Commits the previous canvas into the cache (after the first) and draws a new canvas.
  void begin_canvas();
  /// One denoising step; `taps` (optional) sees the decoder's tapped tensors.
  const StepTensors& step(probe::TapSink* taps = nullptr);
  /// Appends the argmax canvas, applies EOS and pad handling; sets done().
  void end_canvas();

  int canvas() const { return canvas_; }      ///< 0-based index of the current canvas
  int step_index() const { return step_; }    ///< steps done in the current canvas
  int cur_step() const { return cur_step_; }  ///< the reference's countdown for the next step
  std::int64_t batch_size() const { return options_.batch_size; }

  /// Row 0's state now (for a lockstep follower).
  DenoiserState snapshot() const;
  /// Replaces every row's state by `state` (row 0 of another engine), or only row `row`'s when
  /// it is not negative (a mixed batch's row under test; the other rows keep their own): the
  /// next step then decodes exactly the leader's canvas and self-conditioning input there.
  void adopt(const DenoiserState& state, std::int64_t row = -1);

  /// The outcome so far (complete once done()).
  GenerationResult result() const;

 private:
  // The members both public constructors share (options checked by them).
  GenerationEngine(const model::DiffusionGemma& model, GenerateOptions options);
  // Both constructors: prefill and the run's tensors.
  void start(const PaddedPrompts& prompts);
  // The current canvas's position ids for options_.positions (undefined: transformers' own).
  at::Tensor canvas_positions() const;
  // The decoder pass of a step without taps: a CUDA graph replay when possible, else eager.
  at::Tensor graph_decode(const at::Tensor& canvas_in, probe::TapSink* taps);
  // Which (tap, layer) `taps` wants, as a key: a new set means a new capture.
  std::vector<std::int64_t> tap_signature(const probe::TapSink* taps) const;

  const model::DiffusionGemma& model_;
  GenerateOptions options_;
  at::Tensor prompt_;            // [B, L] the rows' prompts (left-padded when they differ)
  at::Tensor lengths_;           // [B, 1] int64: real prompt tokens per row (per-row positions)
  bool padded_ = false;          // some prompt is padded
  at::Tensor canvas_positions_;  // [B, C] int64 per-row positions of this canvas, or undefined
  model::ForwardContext ctx_;
  RandomStreams streams_;
  StableConfidentStopping stopping_;
  at::Tensor eos_;
  model::KvCache cache_;
  at::Tensor input_ids_;           // [B, L + canvases * C]
  at::Tensor finished_sequences_;  // [B] bool
  std::int64_t max_length_ = 0;
  int max_canvases_ = 0;
  // current canvas
  at::Tensor current_;    // [B, C]
  at::Tensor argmax_;     // [B, C]
  at::Tensor sc_logits_;  // [B, C, V]
  at::Tensor finished_;   // [B] bool
  std::vector<int> steps_;
  std::vector<std::vector<int>> steps_per_canvas_;
  StepTensors last_;
  int canvas_ = -1;
  int step_ = 0;
  int cur_step_ = 0;
  bool done_ = false;
  // CUDA graph of this canvas's decoder pass (static inputs copied in before each replay).
  bool use_graph_ = false;
  int graph_canvas_ = -1;  // canvas the graph was captured for (the cache changes per canvas)
  compat::DeviceGraph graph_;
  at::Tensor graph_in_;   // [B, C] int64
  at::Tensor graph_sc_;   // [B, C, V]
  at::Tensor graph_out_;  // [B, C, V] fp32, rewritten by every replay
  std::vector<std::int64_t> graph_taps_key_;
  // Tap copies made inside the graph (rewritten by every replay), handed to the step's sink.
  std::vector<std::tuple<probe::Tap, int, at::Tensor>> graph_taps_;
};

/// Generates for `prompt` [1, L] int64 repeated to options.batch_size bitwise-identical rows.
/// Throws base::ErrorException (InvalidArgument, Cancelled) and c10 errors (OutOfMemory).
/// ref: DiffusionGemmaGenerationMixin.generate, _denoising_step, _finalize_canvas
GenerationResult generate(const model::DiffusionGemma& model, const at::Tensor& prompt,
                          const GenerateOptions& options);
/// Generates for a batch of different prompts (options.batch_size rows, prefill 'batched').
GenerationResult generate(const model::DiffusionGemma& model, const PaddedPrompts& prompts,
                          const GenerateOptions& options);

}  // namespace batchlens::generation
