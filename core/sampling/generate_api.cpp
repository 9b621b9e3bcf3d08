// SPDX-License-Identifier: Apache-2.0
#include "core/sampling/generate_api.h"

#include <sstream>

#include <ATen/ATen.h>

#include "core/sampling/generate.h"

namespace batchlens::sampling {

base::Result<std::string> run_generation(const model::ModelSource& source,
                                         const model::LoadOptions& load,
                                         const GenerateRequest& request) {
  auto loaded = model::load_model(source, load);
  if (!loaded.ok()) {
    return loaded.error();
  }
  return base::guarded([&]() -> std::string {
    const model::DiffusionGemma& m = *loaded.value();
    if (request.prompt.empty()) {
      base::raise(base::ErrorCode::InvalidArgument, "generate: the prompt is empty");
    }
    if (request.rng != "per_row" && request.rng != "shared") {
      base::raise(base::ErrorCode::InvalidArgument,
                  "rng '" + request.rng + "': expected per_row or shared");
    }
    if (request.prefill != "copied" && request.prefill != "batched") {
      base::raise(base::ErrorCode::InvalidArgument,
                  "prefill '" + request.prefill + "': expected copied or batched");
    }
    auto resolved = ops::policy_by_name(request.policy);
    if (!resolved.ok()) {
      throw base::ErrorException(resolved.error());
    }
    const ops::OpPolicy policy = std::move(resolved).value();
    GenerateOptions o;
    o.batch_size = request.batch_size;
    o.seed = request.seed;
    o.rng = request.rng == "shared" ? RngMode::Shared : RngMode::PerRow;
    o.prefill = request.prefill == "batched" ? PrefillMode::Batched : PrefillMode::Copied;
    o.config.sampler.max_denoising_steps = request.max_denoising_steps;
    o.config.max_new_tokens = request.max_new_tokens;
    o.config.eos_token_ids = m.config().eos_token_ids;
    o.config.pad_token_id = m.config().text.pad_token_id;
    o.policy = &policy;
    o.cancel = request.cancel;
    const std::int64_t canvases =
        (request.max_new_tokens + m.config().canvas_length - 1) / m.config().canvas_length;
    base::ProgressClock clock(canvases * request.max_denoising_steps);
    std::int64_t done = 0;
    if (request.progress) {
      o.on_step = [&](const StepRecord& r) {
        ++done;
        request.progress(clock.at(done, "canvas " + std::to_string(r.canvas + 1) + " step " +
                                            std::to_string(r.step) + "/" +
                                            std::to_string(request.max_denoising_steps)));
      };
    }
    const at::Tensor prompt =
        at::tensor(request.prompt, at::TensorOptions().dtype(at::kLong)).view({1, -1});
    const GenerationResult res = generate(m, prompt, o);
    std::ostringstream out;
    out << "generate: " << source.describe() << ", batch " << request.batch_size << ", rng "
        << request.rng << ", prefill " << request.prefill << ", policy " << ops::describe(policy)
        << "\n";
    for (std::size_t r = 0; r < res.rows.size(); ++r) {
      const RowOutcome& row = res.rows[r];
      out << "row " << r << ": steps";
      for (int s : row.steps) {
        out << " " << s;
      }
      out << ", stop position " << row.stop_position << "\n  tokens:";
      for (std::int64_t t : row.tokens) {
        out << " " << t;
      }
      out << "\n";
    }
    return out.str();
  });
}

}  // namespace batchlens::sampling
