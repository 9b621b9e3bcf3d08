// SPDX-License-Identifier: Apache-2.0
#include "core/sampling/generate.h"

#include <ATen/ATen.h>

#include "core/base/error.h"

namespace batchlens::sampling {

namespace {

using model::DiffusionGemma;
using model::ForwardContext;
using model::KvCache;

// The state of the denoising loop of one canvas.
struct Denoiser {
  at::Tensor current;    // [B, C] int64
  at::Tensor argmax;     // [B, C] int64
  at::Tensor sc_logits;  // [B, C, V] model dtype, undefined on the first step
  at::Tensor finished;   // [B] bool
};

}  // namespace

GenerationResult generate(const DiffusionGemma& model, const at::Tensor& prompt,
                          const GenerateOptions& options) {
  const auto& text = model.config().text;
  const GenerationConfig& gc = options.config;
  const std::int64_t b = options.batch_size;
  const std::int64_t c = model.config().canvas_length;
  const std::int64_t vocab = text.vocab_size;
  if (b < 1 || prompt.dim() != 2 || prompt.size(0) != 1 || prompt.size(1) < 1) {
    base::raise(base::ErrorCode::InvalidArgument,
                "generate: expected a prompt [1, L] with L >= 1 and a batch size >= 1");
  }
  if (gc.sampler.max_denoising_steps < 1 || gc.max_new_tokens < 1) {
    base::raise(base::ErrorCode::InvalidArgument,
                "generate: max_denoising_steps and max_new_tokens must be >= 1");
  }
  const at::Device device = model.device();
  const ForwardContext ctx{options.policy, nullptr};
  RandomStreams streams(options.rng, options.seed, b, device);
  StableConfidentStopping stopping(gc.sampler.stability_threshold, gc.sampler.confidence_threshold);
  const at::Tensor eos =
      at::tensor(gc.eos_token_ids, at::TensorOptions().dtype(at::kLong)).to(device);

  // Prefill. ref: generate -> _prepare_encoder_inputs + encoder (is_prefill)
  const at::Tensor prompt_dev = prompt.to(device);
  KvCache cache;
  if (options.prefill == PrefillMode::Copied) {
    KvCache one;
    model.encode(prompt_dev, one, ctx);
    cache = one.repeat_rows(b);
  } else {
    model.encode(prompt_dev.expand({b, -1}).contiguous(), cache, ctx);
  }

  at::Tensor input_ids = prompt_dev.expand({b, -1}).contiguous();  // [B, L]
  const std::int64_t max_length = prompt.size(1) + gc.max_new_tokens;
  const std::int64_t max_canvases = (gc.max_new_tokens + c - 1) / c;
  at::Tensor finished_sequences =
      at::zeros({b}, at::TensorOptions().dtype(at::kBool).device(device));
  GenerationResult result;
  result.rows.resize(static_cast<std::size_t>(b));

  for (int canvas = 0; canvas < max_canvases; ++canvas) {
    if (canvas > 0) {
      // Commit: the last canvas is encoded causally and appended to the cache.
      model.encode(input_ids.narrow(1, input_ids.size(1) - c, c), cache, ctx);
    }
    // ref: _prepare_denoiser_inputs
    Denoiser d;
    d.current = streams.randint(vocab, c);
    d.argmax = d.current;
    d.finished = at::zeros({b}, at::TensorOptions().dtype(at::kBool).device(device));
    stopping.reset();
    std::vector<int> steps(static_cast<std::size_t>(b), 0);

    int done = 0;
    for (int cur_step = gc.sampler.max_denoising_steps; cur_step >= 1; --cur_step) {
      if (options.cancel != nullptr && options.cancel->cancelled()) {
        base::raise(base::ErrorCode::Cancelled, "generation cancelled");
      }
      const at::Tensor active = ~(d.finished | finished_sequences);
      for (std::int64_t r = 0; r < b; ++r) {
        steps[static_cast<std::size_t>(r)] += active[r].item<bool>() ? 1 : 0;
      }
      // ref: _denoising_step
      const at::Tensor canvas_in = d.current;
      const at::Tensor raw = model.decode(canvas_in, cache, d.sc_logits, ctx);  // [B, C, V] fp32
      const at::Tensor temp = temperature(cur_step, gc.sampler, device);
      at::Tensor processed = raw / temp;
      const at::Tensor probs = at::softmax(processed, -1, at::kFloat);
      const at::Tensor sampled =
          streams.multinomial(probs.view({-1, vocab})).squeeze(-1).view({b, c});
      at::Tensor new_argmax = at::argmax(processed, -1);
      const at::Tensor entropy = token_entropy(processed);
      const at::Tensor accepted = entropy_bound_mask(entropy, gc.sampler.entropy_bound);
      const at::Tensor accepted_canvas = at::where(accepted, sampled, d.current);
      const at::Tensor noise = streams.randint(vocab, c);
      at::Tensor new_current = at::where(accepted.logical_not(), noise, accepted_canvas);
      if (d.finished.any().item<bool>()) {
        const at::Tensor f = d.finished.unsqueeze(1);
        new_argmax = at::where(f, d.argmax, new_argmax);
        new_current = at::where(f, d.current, new_current);
        processed = at::where(f.unsqueeze(2), d.sc_logits, processed);
      }
      d.finished = d.finished | stopping(new_argmax, processed);
      d.sc_logits = processed.to(model.weights().embed.scalar_type());
      d.current = new_current;
      d.argmax = new_argmax;
      ++done;
      if (options.on_step) {
        StepRecord rec;
        rec.canvas = canvas;
        rec.step = done;
        rec.cur_step = cur_step;
        rec.temperature = temp.item<float>();
        rec.canvas_in = canvas_in.cpu();
        rec.sampled = sampled.cpu();
        rec.argmax = new_argmax.cpu();
        rec.accepted = accepted.cpu();
        rec.entropy = entropy.cpu();
        rec.finished = d.finished.cpu();
        options.on_step(rec);
      }
      if (d.finished.all().item<bool>()) {
        break;
      }
    }

    // ref: _finalize_canvas (EosTokenCriteria over the whole canvas, MaxLengthCriteria)
    input_ids = at::cat({input_ids, d.argmax}, -1);
    const at::Tensor new_tokens = input_ids.narrow(1, input_ids.size(1) - c, c);
    const at::Tensor is_eos = at::isin(new_tokens, eos);
    at::Tensor finished_this = is_eos.any(-1);
    if (input_ids.size(1) >= max_length) {
      finished_this = at::ones_like(finished_this);
    }
    const at::Tensor previously = finished_sequences;
    finished_sequences = previously | finished_this;
    if (finished_sequences.any().item<bool>()) {
      at::Tensor fresh = new_tokens.clone();
      fresh.masked_fill_(previously.unsqueeze(1), gc.pad_token_id);
      if (finished_this.any().item<bool>()) {
        const at::Tensor cumsum = is_eos.cumsum(-1);
        const at::Tensor pad = (cumsum > 0) & ~((cumsum == 1) & is_eos);
        fresh.masked_fill_(pad, gc.pad_token_id);
      }
      input_ids = at::cat({input_ids.narrow(1, 0, input_ids.size(1) - c), fresh}, -1);
    }
    for (std::int64_t r = 0; r < b; ++r) {
      result.rows[static_cast<std::size_t>(r)].steps.push_back(steps[static_cast<std::size_t>(r)]);
    }
    result.canvases = canvas + 1;
    if (finished_sequences.all().item<bool>()) {
      break;
    }
  }

  result.sequences = input_ids.cpu();
  const std::int64_t l = prompt.size(1);
  const at::Tensor generated = result.sequences.narrow(1, l, result.sequences.size(1) - l);
  const at::Tensor eos_cpu = eos.cpu();
  for (std::int64_t r = 0; r < b; ++r) {
    RowOutcome& row = result.rows[static_cast<std::size_t>(r)];
    const at::Tensor g = generated[r].contiguous();
    row.tokens.assign(g.data_ptr<std::int64_t>(), g.data_ptr<std::int64_t>() + g.numel());
    const at::Tensor hits = at::isin(g, eos_cpu).nonzero();
    row.stop_position = hits.numel() > 0 ? hits[0][0].item<std::int64_t>() : -1;
  }
  return result;
}

}  // namespace batchlens::sampling
