// SPDX-License-Identifier: Apache-2.0
// One encoder prefill + one decoder pass from a safetensors file of inputs to a safetensors
// file of logits and taps: `batchlens-cli forward`, for parity checks and debugging.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/base/error.h"
#include "core/ops/policy.h"

namespace batchlens::setup {}  // namespace batchlens::setup

namespace batchlens::model {
class DiffusionGemma;
}  // namespace batchlens::model

namespace batchlens::setup {

/// What to run and what to keep.
struct ForwardRequest {
  /// safetensors with `input_ids` [B, L] I64 (the prompt), `decoder_input_ids` [B, C] I64 (the
  /// canvas) and optionally `self_conditioning_logits` [B, C, V] (any float dtype). Empty: a
  /// seeded random prompt of `prompt_length` tokens and a random canvas (benchmarks).
  std::filesystem::path inputs;
  std::int64_t prompt_length = 20;  ///< random inputs only
  std::uint64_t input_seed = 0;     ///< random inputs only
  bool self_conditioning = false;   ///< random inputs only: also pass random SC logits
  /// Output safetensors (empty: write nothing): `logits` [B, C, V] F32, and per requested tap
  /// `<tap>.<layer>` (per-layer taps, e.g. `router.scores.3`) or `<tap>` (per-step taps, e.g.
  /// `selfcond.out`).
  std::filesystem::path output;
  std::vector<std::string> taps;  ///< tap names (probe/tap_names.h), or {"all"}
  ops::OpPolicy policy;           ///< every op's strategy (default: as transformers computes)
  std::int64_t rows = 0;          ///< > 0: use row 0 of the inputs, repeated to this many rows
  int repeat = 0;                 ///< > 0: time this many extra decoder passes (after one warm-up)
  /// With repeat > 0 on CUDA: also time the decoder pass with the canvas already on the device
  /// and no host synchronisation, then captured once as a CUDA graph and replayed `repeat`
  /// times; the replay's logits are checked bitwise against the eager pass's.
  bool cuda_graph = false;
  /// With repeat > 0: time the decoder pass as the generation engine runs it instead of the
  /// port op by op: on CUDA the fused kernels where they passed their check, captured once as
  /// a CUDA graph and replayed (eager without host syncs where the capture fails or the replay
  /// differs, as the engine falls back); on a CPU the straight passes, which already run as the
  /// engine does. Fills engine_median_ms, engine_min_ms and engine_mode.
  bool engine_timing = false;
  /// Non-empty (CUDA builds): profile three decoder passes (fused kernels where checked, no
  /// host syncs) and write the Chrome trace here.
  std::filesystem::path profile;
};

/// What was computed, for the CLI to print.
struct ForwardSummary {
  std::int64_t batch = 0;
  std::int64_t prompt_length = 0;
  std::int64_t canvas_length = 0;
  bool self_conditioning = false;
  std::size_t tensors_written = 0;
  double encode_ms = 0.0;
  double decode_ms = 0.0;         ///< the first (written) decoder pass
  double decode_median_ms = 0.0;  ///< median of `repeat` timed passes, no fused kernels
  double decode_min_ms = 0.0;     ///< fastest timed pass
  // cuda_graph only:
  double nosync_median_ms = 0.0;  ///< eager, canvas on the device, no id-range sync
  double nosync_min_ms = 0.0;
  double graph_median_ms = 0.0;  ///< CUDA graph replays
  double graph_min_ms = 0.0;
  double graph_capture_ms = 0.0;
  bool graph_bitwise = false;  ///< graph logits == eager logits, bit for bit
  // cuda_graph with fused kernels (the straight timings above run without them):
  bool fused_ran = false;
  double fused_nosync_median_ms = 0.0;
  double fused_graph_median_ms = 0.0;
  double fused_graph_min_ms = 0.0;
  bool fused_bitwise = false;  ///< fused graph logits == the unfused eager logits
  // engine_timing only:
  double engine_median_ms = 0.0;  ///< the decoder pass as the engine runs it
  double engine_min_ms = 0.0;
  std::string engine_mode;   ///< how it ran, e.g. "CUDA graph replays, fused kernels"
  std::string fused_report;  ///< DiffusionGemma::fused_kernels().report
  std::string graph_error;   ///< why the graph timing failed ("" when it ran)
};

/// Runs the request. Errors: FileNotFound / FileCorrupted (inputs), InvalidArgument (missing
/// or misshapen inputs, unknown tap or policy), IoFailed, OutOfMemory. Never throws; never
/// leaves a partial output file.
base::Result<ForwardSummary> run_forward_file(const model::DiffusionGemma& model,
                                              const ForwardRequest& request);

}  // namespace batchlens::setup
