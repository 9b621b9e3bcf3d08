// SPDX-License-Identifier: Apache-2.0
#include "core/generation/engine.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include <ATen/ATen.h>

#include "core/base/error.h"
#include "core/compat/profile.h"

namespace batchlens::generation {

namespace {

using model::DiffusionGemma;
using model::KvCache;

const GenerateOptions& checked_config(const GenerateOptions& options) {
  if (options.config.sampler.max_denoising_steps < 1 || options.config.max_new_tokens < 1) {
    base::raise(base::ErrorCode::InvalidArgument,
                "generate: max_denoising_steps and max_new_tokens must be >= 1");
  }
  return options;
}

const GenerateOptions& checked(const at::Tensor& prompt, const GenerateOptions& options) {
  if (options.batch_size < 1 || prompt.dim() != 2 || prompt.size(0) != 1 || prompt.size(1) < 1) {
    base::raise(base::ErrorCode::InvalidArgument,
                "generate: expected a prompt [1, L] with L >= 1 and a batch size >= 1");
  }
  return checked_config(options);
}

const GenerateOptions& checked(const PaddedPrompts& p, const GenerateOptions& options) {
  const std::int64_t b = options.batch_size;
  const bool shaped = p.ids.defined() && p.ids.dim() == 2 && p.ids.scalar_type() == at::kLong &&
                      p.ids.size(0) == b && p.ids.size(1) >= 1 && p.valid.defined() &&
                      p.valid.scalar_type() == at::kBool && p.valid.sizes() == p.ids.sizes() &&
                      static_cast<std::int64_t>(p.lengths.size()) == b;
  if (b < 1 || !shaped) {
    base::raise(base::ErrorCode::InvalidArgument,
                "generate: a batch of prompts needs ids [B, L] int64, valid [B, L] bool and B "
                "lengths, B the batch size");
  }
  if (b > 1 && options.prefill == PrefillMode::Copied) {
    base::raise(base::ErrorCode::InvalidArgument,
                "generate: a batch of different prompts is prefilled as one batch (prefill "
                "'batched'); 'copied' copies one prompt's cache into every row");
  }
  return checked_config(options);
}

}  // namespace

std::vector<std::vector<std::int64_t>> batch_rows(
    const std::vector<std::int64_t>& prompt,
    const std::vector<std::vector<std::int64_t>>& companions, std::int64_t batch_size,
    std::int64_t row) {
  std::vector<std::vector<std::int64_t>> rows;
  rows.reserve(static_cast<std::size_t>(batch_size));
  std::size_t next = 0;
  for (std::int64_t r = 0; r < batch_size; ++r) {
    if (r == row || companions.empty()) {
      rows.push_back(prompt);
    } else {
      rows.push_back(companions[next++ % companions.size()]);
    }
  }
  return rows;
}

PaddedPrompts pad_left(const std::vector<std::vector<std::int64_t>>& rows, std::int64_t pad_id) {
  std::size_t longest = 0;
  for (const auto& row : rows) {
    if (row.empty()) {
      base::raise(base::ErrorCode::InvalidArgument, "generate: a prompt in the batch is empty");
    }
    longest = std::max(longest, row.size());
  }
  if (rows.empty()) {
    base::raise(base::ErrorCode::InvalidArgument, "generate: a batch needs at least one prompt");
  }
  const auto b = static_cast<std::int64_t>(rows.size());
  const auto l = static_cast<std::int64_t>(longest);
  PaddedPrompts out;
  out.ids = at::full({b, l}, pad_id, at::TensorOptions().dtype(at::kLong));
  out.valid = at::zeros({b, l}, at::TensorOptions().dtype(at::kBool));
  for (std::int64_t r = 0; r < b; ++r) {
    const auto& row = rows[static_cast<std::size_t>(r)];
    const auto n = static_cast<std::int64_t>(row.size());
    out.ids[r].narrow(0, l - n, n).copy_(at::tensor(row, at::TensorOptions().dtype(at::kLong)));
    out.valid[r].narrow(0, l - n, n).fill_(true);
    out.lengths.push_back(n);
  }
  return out;
}

GenerationEngine::GenerationEngine(const DiffusionGemma& model, GenerateOptions options)
    : model_(model),
      options_(std::move(options)),
      ctx_{options_.policy, nullptr, /*check_id_range=*/false, /*fused_kernels=*/true,
           options_.observer},
      streams_(options_.rng, options_.seed, options_.batch_size, model.device(), options_.lead_row),
      stopping_(options_.config.sampler.stability_threshold,
                options_.config.sampler.confidence_threshold) {}

GenerationEngine::GenerationEngine(const DiffusionGemma& model, const at::Tensor& prompt,
                                   const GenerateOptions& options)
    : GenerationEngine(model, checked(prompt, options)) {
  PaddedPrompts one;
  one.ids = prompt;  // [1, L], repeated into every row
  start(one);
}

model::TokenLayout prefill_layout(const PaddedPrompts& prompts, PositionMode positions,
                                  const at::Device& device) {
  model::TokenLayout layout;
  layout.valid = prompts.valid.to(device);  // [B, L] bool
  if (positions == PositionMode::PerRow && !layout.valid.all().item<bool>()) {
    // Each row counts its real tokens; padding slots get 0 (they are never attended to).
    layout.positions = (layout.valid.to(at::kLong).cumsum(1) - 1).clamp_min(0);  // [B, L]
  }
  return layout;
}

at::Tensor canvas_positions(const PaddedPrompts& prompts, PositionMode positions, int canvas,
                            std::int64_t canvas_length, const at::Device& device) {
  if (positions != PositionMode::PerRow || prompts.valid.all().item<bool>()) {
    return {};  // transformers' shared positions: the model's default, cache.seq_length + i
  }
  const at::TensorOptions longs = at::TensorOptions().dtype(at::kLong).device(device);
  return at::tensor(prompts.lengths, longs.device(at::kCPU)).to(device).unsqueeze(1) +
         canvas * canvas_length + at::arange(canvas_length, longs);  // [B, C]
}

GenerationEngine::GenerationEngine(const DiffusionGemma& model, const PaddedPrompts& prompts,
                                   const GenerateOptions& options)
    : GenerationEngine(model, checked(prompts, options)) {
  start(prompts);
}

void GenerationEngine::start(const PaddedPrompts& prompts) {
  const at::Device device = model_.device();
  const std::int64_t b = options_.batch_size;
  const GenerationConfig& gc = options_.config;
  eos_ = at::tensor(gc.eos_token_ids, at::TensorOptions().dtype(at::kLong)).to(device);
  const bool identical = !prompts.valid.defined();  // one prompt [1, L] in every row
  prompt_ = identical ? prompts.ids.to(device).expand({b, -1}).contiguous()
                      : prompts.ids.to(device);  // [B, L]
  // Prefill. ref: generate -> _prepare_encoder_inputs + encoder (is_prefill), with the 2D
  // attention_mask of a left-padded batch.
  static const std::string prefill_scope_name = "engine.prefill";
  const compat::ProfilerScope scope(&prefill_scope_name);  // for a profiler's trace
  model::TokenLayout layout;
  if (!identical) {
    layout = prefill_layout(prompts, options_.positions, device);
    padded_ = !layout.valid.all().item<bool>();
    lengths_ = at::tensor(prompts.lengths, at::TensorOptions().dtype(at::kLong))
                   .to(device)
                   .unsqueeze(1);  // [B, 1]
  }
  if (identical && options_.prefill == PrefillMode::Copied) {
    KvCache one;
    model_.encode(prompt_.narrow(0, 0, 1), one, ctx_);
    cache_ = one.repeat_rows(b);
  } else {
    model_.encode(prompt_, cache_, ctx_, layout);
  }
  input_ids_ = prompt_;  // [B, L]
  const std::int64_t c = model_.config().canvas_length;
  max_length_ = prompt_.size(1) + gc.max_new_tokens;
  max_canvases_ = static_cast<int>((gc.max_new_tokens + c - 1) / c);
  finished_sequences_ = at::zeros({b}, at::TensorOptions().dtype(at::kBool).device(device));
  use_graph_ =
      options_.cuda_graph && options_.observer == nullptr && compat::DeviceGraph::supported(device);
}

at::Tensor GenerationEngine::canvas_positions() const {
  if (!padded_ || options_.positions != PositionMode::PerRow) {
    return {};  // transformers' shared positions: the model's default, cache.seq_length + i
  }
  const std::int64_t c = model_.config().canvas_length;
  return lengths_ + canvas_ * c +
         at::arange(c, at::TensorOptions().dtype(at::kLong).device(model_.device()));  // [B, C]
}

namespace {

// Passes `wants` through to the step's sink and keeps a copy of each recorded tap (one row only
// when the sink wants no more): inside a capture the copies are graph memory that every replay
// rewrites.
class CapturedTaps final : public probe::TapSink {
 public:
  CapturedTaps(const probe::TapSink* wanted,
               std::vector<std::tuple<probe::Tap, int, at::Tensor>>& out)
      : wanted_(wanted), out_(out) {}
  bool wants(probe::Tap tap, int layer) const override {
    return wanted_ != nullptr && wanted_->wants(tap, layer);
  }
  void record(probe::Tap tap, int layer, const at::Tensor& value) override {
    const std::int64_t row = wanted_ != nullptr && value.dim() > 0 ? wanted_->only_row() : -1;
    out_.emplace_back(tap, layer, (row >= 0 ? value.narrow(0, row, 1) : value).detach().clone());
  }

 private:
  const probe::TapSink* wanted_;
  std::vector<std::tuple<probe::Tap, int, at::Tensor>>& out_;
};

}  // namespace

std::vector<std::int64_t> GenerationEngine::tap_signature(const probe::TapSink* taps) const {
  std::vector<std::int64_t> key;
  if (taps == nullptr) {
    return key;
  }
  const int layers = static_cast<int>(model_.config().text.num_hidden_layers);
  for (const probe::Tap t : probe::all_taps()) {
    for (int l = probe::kNoLayer; l < layers; ++l) {
      key.push_back(taps->wants(t, l) ? 1 : 0);
    }
  }
  key.push_back(taps->only_row());
  return key;
}

at::Tensor GenerationEngine::graph_decode(const at::Tensor& canvas_in, probe::TapSink* taps) {
  std::vector<std::int64_t> key = tap_signature(taps);
  if (graph_canvas_ == canvas_ && graph_.captured() && key == graph_taps_key_) {
    graph_in_.copy_(canvas_in);
    graph_sc_.copy_(sc_logits_);
    graph_.replay();
    for (const auto& [tap, layer, value] : graph_taps_) {
      taps->record_stable(tap, layer, value);
    }
    return graph_out_;
  }
  // First step with self-conditioning of this canvas (or new taps): the eager pass is this
  // step's result and taps (and the warm-up); then the same pass is captured on static copies
  // of its inputs.
  const model::ForwardContext eager_ctx{options_.policy, taps, /*check_id_range=*/false,
                                        /*fused_kernels=*/true, options_.observer};
  at::Tensor eager = model_.decode(canvas_in, cache_, sc_logits_, eager_ctx, canvas_positions_);
  graph_.reset();
  graph_taps_.clear();
  graph_canvas_ = canvas_;
  graph_taps_key_ = std::move(key);
  graph_in_ = canvas_in.clone();
  graph_sc_ = sc_logits_.clone();
  try {
    CapturedTaps captured(taps, graph_taps_);
    const model::ForwardContext ctx{options_.policy, taps != nullptr ? &captured : nullptr,
                                    /*check_id_range=*/false};
    graph_.capture(model_.device(), [&] {
      graph_out_ = model_.decode(graph_in_, cache_, graph_sc_, ctx, canvas_positions_);
    });
    graph_.replay();
    if (!at::equal(graph_out_.view(at::kInt), eager.view(at::kInt))) {
      std::fprintf(stderr,
                   "batchlens: CUDA graph replay differs from the eager decoder pass; "
                   "graphs off for this engine\n");
      use_graph_ = false;
    }
  } catch (const std::exception& e) {
    // The first line only: LibTorch's messages carry a C++ stack trace.
    const std::string what = e.what();
    std::fprintf(stderr, "batchlens: CUDA graph capture failed (%s); graphs off for this engine\n",
                 what.substr(0, what.find('\n')).c_str());
    use_graph_ = false;
  }
  if (!use_graph_) {
    graph_.reset();
    graph_taps_.clear();
    graph_in_ = graph_sc_ = graph_out_ = at::Tensor();
  }
  return eager;
}

bool GenerationEngine::canvas_done() const {
  return step_ >= options_.config.sampler.max_denoising_steps ||
         (step_ > 0 && finished_.all().item<bool>());
}

void GenerationEngine::begin_canvas() {
  const std::int64_t b = options_.batch_size;
  const std::int64_t c = model_.config().canvas_length;
  static const std::string commit_scope_name = "engine.commit";
  const compat::ProfilerScope scope(&commit_scope_name);  // for a profiler's trace
  if (canvas_ >= 0) {
    // Commit: the last canvas is encoded causally and appended to the cache, at the positions
    // it was decoded at. ref: _prepare_kwargs_for_next_canvas (encoder_position_ids)
    model::TokenLayout layout;
    layout.positions = canvas_positions_;
    model_.encode(input_ids_.narrow(1, input_ids_.size(1) - c, c), cache_, ctx_, layout);
  }
  ++canvas_;
  canvas_positions_ = canvas_positions();
  // ref: _prepare_denoiser_inputs
  current_ = streams_.randint(model_.config().text.vocab_size, c);
  argmax_ = current_;
  sc_logits_ = at::Tensor();
  finished_ = at::zeros({b}, at::TensorOptions().dtype(at::kBool).device(model_.device()));
  stopping_.reset();
  steps_.assign(static_cast<std::size_t>(b), 0);
  step_ = 0;
  cur_step_ = options_.config.sampler.max_denoising_steps;
}

const StepTensors& GenerationEngine::step(probe::TapSink* taps) {
  if (options_.cancel != nullptr && options_.cancel->cancelled()) {
    base::raise(base::ErrorCode::Cancelled, "generation cancelled");
  }
  const std::int64_t b = options_.batch_size;
  const std::int64_t c = model_.config().canvas_length;
  const std::int64_t vocab = model_.config().text.vocab_size;
  const at::Device device = model_.device();
  const GenerationConfig& gc = options_.config;
  const at::Tensor active = ~(finished_ | finished_sequences_);
  const at::Tensor active_cpu = active.cpu();
  for (std::int64_t r = 0; r < b; ++r) {
    steps_[static_cast<std::size_t>(r)] += active_cpu[r].item<bool>() ? 1 : 0;
  }
  // ref: _denoising_step
  const model::ForwardContext ctx{options_.policy, taps, /*check_id_range=*/false,
                                  /*fused_kernels=*/true, options_.observer};
  const at::Tensor canvas_in = current_;
  // Named ranges for a profiler's trace (BATCHLENS_TRACE); nothing when none listens.
  static const std::string decode_scope_name = "engine.decode";
  static const std::string sample_scope_name = "engine.sample";
  at::Tensor raw;  // [B, C, V]
  {
    const compat::ProfilerScope scope(&decode_scope_name);
    raw = use_graph_ && sc_logits_.defined()
              ? graph_decode(canvas_in, taps)
              : model_.decode(canvas_in, cache_, sc_logits_, ctx, canvas_positions_);
  }
  const compat::ProfilerScope sample_scope(&sample_scope_name);
  const at::Tensor temp = temperature(cur_step_, gc.sampler, device);
  at::Tensor processed = raw / temp;
  const at::Tensor probs = at::softmax(processed, -1, at::kFloat);
  const at::Tensor sampled = streams_.multinomial(probs.view({-1, vocab})).squeeze(-1).view({b, c});
  at::Tensor new_argmax = at::argmax(processed, -1);
  const at::Tensor entropy = token_entropy(processed);
  const at::Tensor accepted = entropy_bound_mask(entropy, gc.sampler.entropy_bound);
  const at::Tensor accepted_canvas = at::where(accepted, sampled, current_);
  const at::Tensor noise = streams_.randint(vocab, c);
  at::Tensor new_current = at::where(accepted.logical_not(), noise, accepted_canvas);
  // The stopping criterion's entropy is the sampler's while `processed` is unchanged: the
  // reference computes it again over [B, C, V], with the same bits.
  at::Tensor stop_entropy = entropy;
  if (finished_.any().item<bool>()) {
    const at::Tensor f = finished_.unsqueeze(1);
    new_argmax = at::where(f, argmax_, new_argmax);
    new_current = at::where(f, current_, new_current);
    processed = at::where(f.unsqueeze(2), sc_logits_, processed);
    stop_entropy = at::Tensor();
  }
  finished_ = finished_ | stopping_(new_argmax, processed, stop_entropy);
  sc_logits_ = processed.to(model_.weights().embed.scalar_type());
  current_ = new_current;
  argmax_ = new_argmax;
  ++step_;
  --cur_step_;
  last_ =
      StepTensors{canvas_in, sampled, new_argmax, accepted, entropy, finished_, temp.item<float>(),
                  // kept only where asked: [B, C, V] would otherwise live through the next pass
                  options_.record_first_logits && step_ == 1 ? raw : at::Tensor()};
  return last_;
}

void GenerationEngine::end_canvas() {
  const std::int64_t c = model_.config().canvas_length;
  const GenerationConfig& gc = options_.config;
  // ref: _finalize_canvas (EosTokenCriteria over the whole canvas, MaxLengthCriteria)
  input_ids_ = at::cat({input_ids_, argmax_}, -1);
  const at::Tensor new_tokens = input_ids_.narrow(1, input_ids_.size(1) - c, c);
  const at::Tensor is_eos = at::isin(new_tokens, eos_);
  at::Tensor finished_this = is_eos.any(-1);
  if (input_ids_.size(1) >= max_length_) {
    finished_this = at::ones_like(finished_this);
  }
  const at::Tensor previously = finished_sequences_;
  finished_sequences_ = previously | finished_this;
  if (finished_sequences_.any().item<bool>()) {
    at::Tensor fresh = new_tokens.clone();
    fresh.masked_fill_(previously.unsqueeze(1), gc.pad_token_id);
    if (finished_this.any().item<bool>()) {
      const at::Tensor cumsum = is_eos.cumsum(-1);
      const at::Tensor pad = (cumsum > 0) & ~((cumsum == 1) & is_eos);
      fresh.masked_fill_(pad, gc.pad_token_id);
    }
    input_ids_ = at::cat({input_ids_.narrow(1, 0, input_ids_.size(1) - c), fresh}, -1);
  }
  steps_per_canvas_.push_back(steps_);
  done_ = canvas_ + 1 >= max_canvases_ || finished_sequences_.all().item<bool>();
}

DenoiserState GenerationEngine::snapshot() const {
  DenoiserState s;
  s.current = current_.narrow(0, 0, 1);
  s.argmax = argmax_.narrow(0, 0, 1);
  if (sc_logits_.defined()) {
    s.sc_logits = sc_logits_.narrow(0, 0, 1);
  }
  s.finished = finished_.narrow(0, 0, 1);
  return s;
}

void GenerationEngine::adopt(const DenoiserState& s, std::int64_t row) {
  const std::int64_t b = options_.batch_size;
  if (row >= 0 && b > 1) {
    // One row: the others keep their state. [B, ...] with row `row` replaced.
    const auto with_row = [&](const at::Tensor& all, const at::Tensor& one) {
      at::Tensor out = all.clone();
      out.narrow(0, row, 1).copy_(one);
      return out;
    };
    current_ = with_row(current_, s.current);
    argmax_ = with_row(argmax_, s.argmax);
    finished_ = with_row(finished_, s.finished);
    if (s.sc_logits.defined() != sc_logits_.defined()) {
      base::raise(base::ErrorCode::Internal,
                  "lockstep: the leader and a follower are at different steps");
    }
    if (s.sc_logits.defined()) {
      sc_logits_ = with_row(sc_logits_, s.sc_logits);
    }
    return;
  }
  current_ = s.current.expand({b, -1}).contiguous();
  argmax_ = s.argmax.expand({b, -1}).contiguous();
  sc_logits_ = s.sc_logits.defined() ? s.sc_logits.expand({b, -1, -1}).contiguous() : at::Tensor();
  finished_ = s.finished.expand({b}).contiguous();
}

GenerationResult GenerationEngine::result() const {
  GenerationResult result;
  const std::int64_t b = options_.batch_size;
  result.sequences = input_ids_.cpu();
  result.canvases = static_cast<int>(steps_per_canvas_.size());
  result.rows.resize(static_cast<std::size_t>(b));
  const std::int64_t l = prompt_.size(1);
  const at::Tensor generated = result.sequences.narrow(1, l, result.sequences.size(1) - l);
  const at::Tensor eos_cpu = eos_.cpu();
  for (std::int64_t r = 0; r < b; ++r) {
    RowOutcome& row = result.rows[static_cast<std::size_t>(r)];
    for (const auto& per_row : steps_per_canvas_) {
      row.steps.push_back(per_row[static_cast<std::size_t>(r)]);
    }
    const at::Tensor g = generated[r].contiguous();
    row.tokens.assign(g.data_ptr<std::int64_t>(), g.data_ptr<std::int64_t>() + g.numel());
    const at::Tensor hits = at::isin(g, eos_cpu).nonzero();
    row.stop_position = hits.numel() > 0 ? hits[0][0].item<std::int64_t>() : -1;
    if (row.stop_position >= 0) {
      // The row ends with the canvas of its EOS, as it does alone: the canvases its batch
      // generated after it are pads and 0 steps, not its output.
      const std::int64_t c = model_.config().canvas_length;
      const auto canvases = static_cast<std::size_t>(row.stop_position / c + 1);
      row.tokens.resize(std::min(row.tokens.size(), canvases * static_cast<std::size_t>(c)));
      row.steps.resize(std::min(row.steps.size(), canvases));
    }
  }
  return result;
}

namespace {

GenerationResult run_to_end(GenerationEngine& engine, const GenerateOptions& options) {
  while (!engine.done()) {
    engine.begin_canvas();
    while (!engine.canvas_done()) {
      const StepTensors& t = engine.step();
      if (options.on_step) {
        StepRecord rec;
        rec.canvas = engine.canvas();
        rec.step = engine.step_index();
        rec.cur_step = engine.cur_step() + 1;
        rec.temperature = t.temperature;
        rec.canvas_in = t.canvas_in.cpu();
        rec.sampled = t.sampled.cpu();
        rec.argmax = t.argmax.cpu();
        rec.accepted = t.accepted.cpu();
        rec.entropy = t.entropy.cpu();
        rec.finished = t.finished.cpu();
        if (options.record_first_logits && rec.step == 1) {
          rec.logits = t.logits.cpu();
        }
        options.on_step(rec);
      }
    }
    engine.end_canvas();
  }
  return engine.result();
}

}  // namespace

GenerationResult generate(const DiffusionGemma& model, const at::Tensor& prompt,
                          const GenerateOptions& options) {
  GenerationEngine engine(model, prompt, options);
  return run_to_end(engine, options);
}

GenerationResult generate(const DiffusionGemma& model, const PaddedPrompts& prompts,
                          const GenerateOptions& options) {
  GenerationEngine engine(model, prompts, options);
  return run_to_end(engine, options);
}

}  // namespace batchlens::generation
