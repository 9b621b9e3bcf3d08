// SPDX-License-Identifier: Apache-2.0
#include "core/setup/generate_api.h"

#include <optional>
#include <sstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "core/base/input.h"
#include "core/generation/engine.h"
#include "core/model/diffusion_gemma.h"
#include "core/model/safetensors.h"

namespace batchlens::setup {

namespace {

using base::take;

using base::ErrorCode;

}  // namespace

base::Result<GenerateReport> run_generation(const model::ModelSource& source,
                                            const model::LoadOptions& load,
                                            const GenerateRequest& request) {
  return base::guarded([&]() -> GenerateReport {
    if (request.batch_size < 1 || request.batch_size > 4096) {
      base::raise(ErrorCode::InvalidArgument,
                  "batch size must be in 1..4096, not " + std::to_string(request.batch_size));
    }
    if (request.row < 0 || request.row >= request.batch_size) {
      base::raise(ErrorCode::InvalidArgument, "the row under test must be in 0.." +
                                                  std::to_string(request.batch_size - 1) +
                                                  ", not " + std::to_string(request.row));
    }
    const ops::OpPolicy& policy = request.policy;
    model::LoadOptions sized = load;  // what will run, for the memory check before loading
    sized.workload.rows = request.batch_size;
    sized.workload.max_batch = request.batch_size;
    const Session session = take(open_session(source, sized, request.prompt, request.overrides));
    const model::DiffusionGemma& m = *session.model;
    // Every companion checked before any work.
    const std::vector<std::vector<std::int64_t>> companion_ids =
        take(session.prepare_companions(request.companions, session.inputs, request.overrides));
    const bool mixed = !companion_ids.empty() && request.batch_size > 1;
    GenerateReport report;
    report.config = session.inputs.generation;
    report.prompt_ids = session.inputs.prompt_ids;
    report.has_text = session.inputs.tokenizer != nullptr;
    report.model = source.describe();
    report.policy = ops::describe(policy);
    report.rng = generation::name(request.rng);
    report.prefill = generation::name(request.prefill);
    report.seed = request.seed;

    generation::GenerateOptions o;
    o.batch_size = request.batch_size;
    o.positions = request.positions;
    o.lead_row = request.row;
    o.record_first_logits = request.record_logits && !request.record_path.empty();
    o.seed = request.seed;
    o.rng = request.rng;
    o.prefill = request.prefill;
    o.config = report.config;
    o.policy = &policy;
    o.cuda_graph = load.switches.cuda_graphs;
    o.cancel = request.cancel;
    const int steps = report.config.sampler.max_denoising_steps;
    const std::int64_t canvases =
        (report.config.max_new_tokens + m.config().canvas_length - 1) / m.config().canvas_length;
    base::ProgressClock clock(canvases * steps);
    std::int64_t done = 0;
    std::vector<std::pair<std::string, at::Tensor>> record;
    // Only when someone listens: each record copies the step's tensors to the host.
    if (!request.record_path.empty() || request.progress) {
      o.on_step = [&](const generation::StepRecord& r) {
        if (!request.record_path.empty()) {
          const std::string key =
              "c" + std::to_string(r.canvas) + ".s" + std::to_string(r.step) + ".";
          record.emplace_back(key + "canvas_in", r.canvas_in);
          record.emplace_back(key + "sampled", r.sampled);
          record.emplace_back(key + "argmax", r.argmax);
          record.emplace_back(key + "accepted", r.accepted.to(at::kByte));
          record.emplace_back(key + "entropy", r.entropy);
          record.emplace_back(key + "finished", r.finished.to(at::kByte));
          record.emplace_back(key + "temperature", at::full({1}, r.temperature, at::kFloat));
          if (r.logits.defined()) {
            record.emplace_back(key + "logits", r.logits);
          }
        }
        if (request.progress) {
          // A canvas can stop early; its skipped steps count as done.
          done = static_cast<std::int64_t>(r.canvas) * steps + r.step;
          request.progress(clock.at(done, "canvas " + std::to_string(r.canvas + 1) + " step " +
                                              std::to_string(r.step) + "/" +
                                              std::to_string(steps)));
        }
      };
    }
    at::Tensor prompt =
        at::tensor(report.prompt_ids, at::TensorOptions().dtype(at::kLong)).view({1, -1});
    generation::GenerationResult res;
    at::Tensor mask;  // [B, L] u8, a mixed batch's
    if (mixed) {
      const generation::PaddedPrompts padded = generation::pad_left(
          generation::batch_rows(report.prompt_ids, companion_ids, request.batch_size, request.row),
          m.config().text.pad_token_id);
      const std::int64_t longest = padded.ids.size(1);
      const auto pad = longest - static_cast<std::int64_t>(report.prompt_ids.size());
      report.composition = "row " + std::to_string(request.row) + " under test, " +
                           std::to_string(companion_ids.size()) + " companion prompt" +
                           (companion_ids.size() == 1 ? "" : "s") + " (cycled), padded to " +
                           std::to_string(longest) + " tokens (" + std::to_string(pad) +
                           " padding slots before the row under test), positions " +
                           generation::name(request.positions);
      report.row = request.row;
      res = generation::generate(m, padded, o);
      prompt = padded.ids;
      mask = padded.valid.to(at::kByte);
    } else {
      res = generation::generate(m, prompt, o);
    }
    if (!request.record_path.empty()) {
      record.emplace_back("prompt", prompt);
      if (mask.defined()) {
        record.emplace_back("attention_mask", mask);
      }
      record.emplace_back("sequences", res.sequences);
      model::write_safetensors(request.record_path, record,
                               {{"batch", std::to_string(request.batch_size)},
                                {"seed", std::to_string(request.seed)},
                                {"rng", report.rng},
                                {"prefill", report.prefill},
                                {"positions", generation::name(request.positions)},
                                {"row", std::to_string(request.row)},
                                {"generation_config", generation::to_json(report.config)},
                                {"canvases", std::to_string(res.canvases)}});
    }
    for (const generation::RowOutcome& row : res.rows) {
      GeneratedRow out;
      out.tokens = row.tokens;
      out.stop_position = row.stop_position;
      out.steps = row.steps;
      out.text = session.inputs.decode_until_stop(row.tokens, row.stop_position);
      report.rows.push_back(std::move(out));
    }
    return report;
  });
}

std::string format_report(const GenerateReport& r, bool show_ids) {
  std::ostringstream out;
  out << "generate: " << r.model << ", batch " << r.rows.size() << ", seed " << r.seed << ", rng "
      << r.rng << ", prefill " << r.prefill << ", policy " << r.policy << ", "
      << r.config.sampler.max_denoising_steps << " steps, max " << r.config.max_new_tokens
      << " new tokens\n";
  out << "prompt: " << r.prompt_ids.size() << " tokens\n";
  if (!r.composition.empty()) {
    out << "batch: " << r.composition << "\n";
  }
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    const GeneratedRow& row = r.rows[i];
    const bool mixed = !r.composition.empty();
    const bool same_as_0 = i > 0 && row.tokens == r.rows[0].tokens;
    out << "row " << i << (mixed && static_cast<std::int64_t>(i) == r.row ? " (under test)" : "")
        << ": steps";
    for (int s : row.steps) {
      out << " " << s;
    }
    out << ", stop position " << row.stop_position;
    if (i > 0 && !mixed) {
      out << (same_as_0 ? ", identical to row 0" : ", differs from row 0");
    }
    out << "\n";
    if (r.has_text) {
      out << "  text: " << row.text << "\n";
    }
    if (show_ids || !r.has_text) {
      out << "  tokens:";
      for (std::int64_t t : row.tokens) {
        out << " " << t;
      }
      out << "\n";
    }
  }
  return out.str();
}

std::string report_json(const GenerateReport& r) {
  nlohmann::ordered_json j;
  j["model"] = r.model;
  j["policy"] = r.policy;
  j["rng"] = r.rng;
  j["prefill"] = r.prefill;
  j["seed"] = r.seed;
  j["generation_config"] = nlohmann::ordered_json::parse(generation::to_json(r.config));
  j["prompt_ids"] = r.prompt_ids;
  j["composition"] = r.composition.empty() ? nlohmann::ordered_json(nullptr)
                                           : nlohmann::ordered_json(r.composition);
  j["rows"] = nlohmann::ordered_json::array();
  for (const GeneratedRow& row : r.rows) {
    nlohmann::ordered_json o;
    o["tokens"] = row.tokens;
    o["text"] = r.has_text ? nlohmann::ordered_json(row.text) : nlohmann::ordered_json(nullptr);
    o["stop_position"] = row.stop_position;
    o["steps"] = row.steps;
    j["rows"].push_back(std::move(o));
  }
  return base::dump_json_lossy(j, 2) + "\n";
}

}  // namespace batchlens::setup
