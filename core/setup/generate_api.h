// SPDX-License-Identifier: Apache-2.0
// One-shot generation for the CLI: text in, text out, through the front door. Torch-free header.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/base/cancel.h"
#include "core/base/error.h"
#include "core/base/progress.h"
#include "core/generation/generation_config.h"
#include "core/generation/modes.h"
#include "core/model/loader.h"
#include "core/ops/policy.h"
#include "core/setup/front_door.h"

namespace batchlens::setup {

/// A generation run described with plain values.
struct GenerateRequest {
  Prompt prompt;
  std::int64_t batch_size = 1;
  /// A mixed batch (issue #35): the other rows' prompts, cycled over every row but `row`, which
  /// holds `prompt`; the batch left-padded, masked and positioned by `positions` as
  /// transformers' generate does it (Shared). Empty: `prompt` in every row.
  std::vector<Prompt> companions;
  std::int64_t row = 0;
  generation::PositionMode positions = generation::PositionMode::Shared;
  std::uint64_t seed = 0;
  generation::GenerationOverrides overrides;  ///< over generation_config.json (or its defaults)
  generation::RngMode rng = generation::RngMode::PerRow;
  generation::PrefillMode prefill = generation::PrefillMode::Copied;
  ops::OpPolicy policy;  ///< every op's strategy (default: as transformers computes)
  const base::CancelToken* cancel = nullptr;
  base::ProgressFn progress;  ///< one report per denoising step (all rows)
  /// When set, every step's record (canvas in, draws, argmax, acceptance, entropy, finished)
  /// is written there as safetensors, "c{canvas}.s{step}.{field}", with "prompt" and
  /// "sequences": what tools/parity replays through the reference. "prompt" is [B, L] (left-
  /// padded, with "attention_mask" [B, L] u8 beside it, for a mixed batch).
  std::filesystem::path record_path;
  /// With record_path: also "c{canvas}.s1.logits", the decoder's raw logits [B, C, V] at each
  /// canvas's first step (tools/parity's bitwise check; large for a big vocabulary).
  bool record_logits = false;
};

/// What one row produced.
struct GeneratedRow {
  std::vector<std::int64_t> tokens;  ///< generated ids (all canvases; pads after the stop)
  std::string text;                  ///< tokens decoded up to the stop, specials kept
  std::int64_t stop_position = -1;   ///< index of the first EOS in `tokens`, -1 without one
  std::vector<int> steps;            ///< denoising steps taken per canvas
};

struct GenerateReport {
  std::string model;   ///< ModelSource::describe()
  std::string policy;  ///< ops::describe of the policy used
  std::string rng;
  std::string prefill;
  std::uint64_t seed = 0;
  generation::GenerationConfig config;   ///< what ran (file + overrides)
  std::vector<std::int64_t> prompt_ids;  ///< what the model saw (the row under test's)
  std::string composition;  ///< a mixed batch's rows, padding and positions; "" for identical rows
  std::int64_t row = 0;     ///< the row under test (a mixed batch's)
  bool has_text = false;    ///< a tokenizer was found; `text` fields are filled
  std::vector<GeneratedRow> rows;  ///< one per batch row
};

/// Opens a session (open_session: generation config, tokenizer, prompt, model; without a
/// tokenizer only ids are given) and generates. Errors: those of load_model, InvalidArgument (bad
/// names or values, an empty prompt, a prompt id outside the vocabulary, text without a tokenizer),
/// OutOfMemory, Cancelled when `cancel` fires. Never throws.
base::Result<GenerateReport> run_generation(const model::ModelSource& source,
                                            const model::LoadOptions& load,
                                            const GenerateRequest& request);

/// Human text: a header, then per row the steps, stop position and text (and ids when
/// `show_ids` or when there is no text).
std::string format_report(const GenerateReport& report, bool show_ids);

/// The report as JSON (stable keys: model, policy, rng, prefill, seed, generation_config,
/// prompt_ids, composition (null for identical rows), rows[{tokens, text, stop_position,
/// steps}]).
std::string report_json(const GenerateReport& report);

}  // namespace batchlens::setup
