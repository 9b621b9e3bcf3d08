// SPDX-License-Identifier: Apache-2.0
// Paired batch-size experiments: what to run (ExperimentSpec) and what came out
// (ExperimentResult). Plain values, torch-free: the UI, the CLI and the HDF5 file share them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/base/cancel.h"
#include "core/base/error.h"
#include "core/base/progress.h"
#include "core/base/system_info.h"
#include "core/experiment/causes.h"
#include "core/experiment/exact_reference.h"
#include "core/experiment/kernel_provenance.h"
#include "core/experiment/run_vocabulary.h"
#include "core/generation/generation_config.h"
#include "core/generation/modes.h"
#include "core/model/loader.h"
#include "core/ops/policy.h"
#include "core/setup/prompt.h"
#include "core/text/token_diff.h"

namespace batchlens::experiment {

/// A dense row-major array with its shape.
template <class T>
struct NdArray {
  std::vector<std::int64_t> shape;
  std::vector<T> data;

  NdArray() = default;
  explicit NdArray(std::vector<std::int64_t> dims, T fill = T{}) : shape(std::move(dims)) {
    std::int64_t n = 1;
    for (std::int64_t d : shape) {
      n *= d;
    }
    data.assign(static_cast<std::size_t>(n), fill);
  }
  /// `data` taken as is, with `dims` as its shape (the caller sized it).
  static NdArray of(const std::vector<std::int64_t>& dims, std::vector<T> data) {
    NdArray a;
    a.shape = dims;
    a.data = std::move(data);
    return a;
  }
  std::size_t offset(std::initializer_list<std::int64_t> index) const {
    std::size_t off = 0;
    std::size_t k = 0;
    for (std::int64_t i : index) {
      off = off * static_cast<std::size_t>(shape[k++]) + static_cast<std::size_t>(i);
    }
    return off;
  }
  T& at(std::initializer_list<std::int64_t> index) { return data[offset(index)]; }
  const T& at(std::initializer_list<std::int64_t> index) const { return data[offset(index)]; }
  /// The element at `index`, or null when the index has another rank than the array, lies
  /// outside its shape, or the data does not hold the shape (a result from a damaged file or
  /// built elsewhere). at() trusts both; readers of untrusted results use this.
  const T* find(std::initializer_list<std::int64_t> index) const {
    if (index.size() != shape.size()) {
      return nullptr;
    }
    std::size_t count = 1;
    std::size_t off = 0;
    auto dim = shape.begin();
    for (const std::int64_t i : index) {
      const std::int64_t d = *dim++;
      if (d <= 0 || i < 0 || i >= d ||
          __builtin_mul_overflow(count, static_cast<std::size_t>(d), &count)) {
        return nullptr;
      }
      off = off * static_cast<std::size_t>(d) + static_cast<std::size_t>(i);
    }
    return count == data.size() ? &data[off] : nullptr;
  }
  bool empty() const { return data.empty(); }
};

/// Free: every run follows its own trajectory. Lockstep: the batched runs are forced onto the B=1
/// reference's canvas every step, and the rows of each batch are compared with its row 0.
enum class RunMode { Free, Lockstep };
/// "free" / "lockstep".
const char* name(RunMode mode);
/// The mode of a name; InvalidArgument naming the accepted ones otherwise.
base::Result<RunMode> parse_run_mode(std::string_view text);

/// What the rows of each batched run hold (issue #35). Without companions every row holds the
/// prompt (identical rows, as every experiment before). With companions the batch is what a
/// server builds: the prompt under test in row `row`, the companions (other requests' prompts)
/// cycled over the other rows, left-padded, masked, and positioned as transformers' `generate`
/// does it (`positions` shared) or from each row's own mask (per_row, what a fix would do). The
/// B=1 reference is always the prompt alone; each row keeps its own noise stream (RngMode).
struct Composition {
  std::vector<setup::Prompt> companions;
  std::int64_t row = 0;  ///< the row under test, in every batch
  generation::PositionMode positions = generation::PositionMode::Shared;
  bool mixed() const { return !companions.empty(); }
};
/// "B rows: the prompt in row K, 3 companions cycled, shared positions", or "identical rows".
std::string describe(const Composition& composition);

/// What to run. Defaults: B=1 reference, one B=1 repeat, B = 2, 3, 4; per-row random streams,
/// the prompt cache copied from batch 1, free trajectories, the default policy.
struct ExperimentSpec {
  model::ModelSource model;
  /// device, dtype, experts; switches (fused kernels, CUDA graphs: how it computed, never what;
  /// kept in the spec JSON only when one is set). Progress and cancel are not part of a spec.
  model::LoadOptions load;
  std::string prompt = "Write a long essay about Portugal.";
  bool chat_template = true;
  std::vector<std::int64_t> prompt_ids;  ///< used instead of `prompt` when non-empty
  std::uint64_t seed = 0;                ///< sampling seed
  generation::GenerationOverrides overrides;
  std::vector<std::int64_t> batch_sizes{2, 3, 4};
  int repeats = 1;  ///< extra B=1 runs: the noise floor
  generation::RngMode rng = generation::RngMode::PerRow;
  generation::PrefillMode prefill = generation::PrefillMode::Copied;
  RunMode mode = RunMode::Free;
  ops::OpPolicy policy;  ///< every run's policy (JSON: ops::policy_text)
  /// When set, every run again with ops::combine(policy, workaround).
  std::optional<ops::OpPolicy> workaround;
  std::vector<std::string> taps;  ///< tap names; empty = all
  /// The rows of each batch (in the spec JSON only when it has companions or a row other than 0).
  Composition composition;
  /// Record each engine's kernels per op family and layer (experiment/kernel_provenance.h): one
  /// extra decoder pass per engine, with and without self-conditioning, apart from the runs. How,
  /// not what: not in the spec JSON (a file's /kernels group says whether it was recorded).
  bool kernels = false;
};

/// InvalidArgument naming the first bad field (sizes, names, emulation off the CPU, ...).
base::Result<void> validate(const ExperimentSpec& spec);
nlohmann::json to_json(const ExperimentSpec& spec);
base::Result<ExperimentSpec> spec_from_json(const nlohmann::json& doc);
/// spec_from_json of a spec's JSON text (an experiment file's /spec/@spec_json), parsed by
/// base::parse_json: nesting deeper than base::kMaxJsonDepth and malformed JSON are
/// FileCorrupted, and messages never echo the text. Never throws.
base::Result<ExperimentSpec> spec_from_json_text(std::string_view text);

/// Where and with what the experiment ran.
struct Provenance {
  std::string tool_version;
  std::string created_utc;
  std::string host;
  std::string device;       ///< "cpu", "cuda:0"
  std::string device_name;  ///< CPU model or GPU name
  std::string driver;       ///< NVIDIA driver ("" on CPU)
  std::string cuda;         ///< CUDA runtime ("" on CPU)
  std::string cublas;
  std::string libtorch;
  std::string blas;  ///< CPU BLAS / oneDNN description
  std::string dtype;
  std::int64_t threads = 0;
  bool emulated = false;  ///< some run used the emulated split-K kernel
  /// The CPU's ISA and LibTorch's use of it (schema 1.3: the group /provenance/cpu; empty in
  /// files before 1.3).
  base::CpuIsa cpu;
};

/// One engine's run: its batch size, policy and row 0's trajectory.
struct RunResult {
  std::string id;  ///< "ref", "repeat1", "b2", "wa.ref", "wa.b2", ...
  std::int64_t batch_size = 1;
  RunGroup group = RunGroup::Main;
  std::string policy_json;  ///< ops::to_json of the policy
  std::string policy_text;  ///< ops::describe
  bool emulated = false;
  double wall_time_s = 0;
  // Row 0 per tick (S ticks of the experiment; -1 / 0 where this run did not step).
  NdArray<std::int64_t> canvas_in;  ///< [S, C]
  NdArray<std::int64_t> argmax;     ///< [S, C]
  NdArray<std::int64_t> sampled;    ///< [S, C]
  NdArray<std::uint8_t> accepted;   ///< [S, C]
  NdArray<float> entropy;           ///< [S, C]
  std::vector<int> tick_canvas;     ///< [S] canvas of this run's step at each tick, -1: no step
  std::vector<int> tick_step;       ///< [S] 1-based step within the canvas, -1: no step
  // Row 0's outcome.
  std::vector<std::int64_t> tokens;
  std::string text;
  std::int64_t stop_position = -1;
  std::vector<int> steps;  ///< denoising steps per canvas
};

/// Where a comparison first differs. tick = -1 when it never does.
struct Divergence {
  int tick = -1;
  int canvas = -1;  ///< 0-based index; shown as canvas + 1
  int step = -1;    ///< 1-based step within the canvas
  int layer = -1;   ///< -1 for per-step taps
  std::string tap;  ///< tap name, or "tokens" when only the sampler state differs
  std::int64_t position = -1;
  bool found() const { return tick >= 0; }
};

/// Bits to mark sampler decisions that differ at a position (sampler_diff).
enum SamplerBits : std::uint8_t {
  CanvasInDiffers = 1,
  SampledDiffers = 2,
  ArgmaxDiffers = 4,
  AcceptedDiffers = 8,
};

/// Reference vs run (row 0 of each), or a batched run's rows vs its own row 0 (ComparisonKind).
struct ComparisonResult {
  std::string id;         ///< "ref__b2", "b4.rows"
  std::string reference;  ///< run id
  std::string run;        ///< run id
  ComparisonKind kind = ComparisonKind::Row0;
  // Per tick, layer slot (layers 0..L-1, slot L = per-step taps) and tap (spec's tap order).
  NdArray<float> frac_differ;           ///< [S, L+1, T] share of elements with different bits
  NdArray<float> max_abs;               ///< [S, L+1, T]
  NdArray<float> max_ulp;               ///< [S, L+1, T]
  NdArray<float> pos_frac_differ;       ///< [S, L+1, T, C] (row0 only)
  NdArray<float> pos_max_abs;           ///< [S, L+1, T, C] (row0 only)
  NdArray<float> pos_max_ulp;           ///< [S, L+1, T, C] (row0 only)
  NdArray<std::uint8_t> routing_flips;  ///< [S, L, C] expert sets differ (row0 only)
  NdArray<float> router_margin;         ///< [S, L, C] the reference's k-th minus (k+1)-th score
  NdArray<std::uint8_t> sampler_diff;   ///< [S, C] SamplerBits (row0 only)
  std::vector<std::uint8_t> compared;   ///< [S] 1 where both stepped (ticks of the group)
  Divergence first;
  bool tokens_identical = true;
  std::int64_t tokens_changed = 0;
  bool stop_changed = false;
  bool steps_changed = false;
  std::vector<text::TokenEdit> token_diff;
};

/// One trial: the fix tried (on top of the spec's own policy) and what came of it.
struct CulpritTrial {
  std::string stage;       ///< "baseline", "search", "minimise", "narrow", "confirm"
  std::string fix;         ///< ops::describe of the fix tried
  bool identical = false;  ///< row 0 of every batch size bitwise B=1's at every tick and tap
  Divergence first;        ///< else the earliest first divergence over the batch sizes
  std::string comparison;  ///< the comparison it was found in, e.g. "ref__b4"
  double wall_s = 0.0;
};

/// Decoder forward time at one batch size without and with the fix: medians of interleaved
/// passes (setup/policy_cost.h) and their interquartile ranges.
struct CulpritCost {
  int batch_size = 0;
  double default_ms = 0.0;                          ///< the spec's own policy
  double fixed_ms = 0.0;                            ///< with the fix
  double default_q1_ms = 0.0, default_q3_ms = 0.0;  ///< 0: not recorded (files before #34)
  double fixed_q1_ms = 0.0, fixed_q3_ms = 0.0;
  bool noisy = false;  ///< the ranges overlap or the machine was busy: not a measured difference
  bool cpu = false;    ///< measured on a CPU: not what the fix costs on a GPU
  double overhead() const { return default_ms > 0 ? fixed_ms / default_ms - 1.0 : 0.0; }
  /// "+3.1 % at B=4", "within the noise at B=4 (median +556 %)", with "; on a CPU, not a GPU
  /// cost" where measured on one.
  std::string text() const;
  /// "decoder forward 41.20 ms (IQR 40.90-41.60) -> 42.50 ms (IQR 42.10-43.00): +3.1 %", the
  /// flags after it ("within the noise", "on a CPU, not a GPU cost").
  std::string detail() const;
};

struct CulpritReport {
  ops::Strategy strategy = ops::Strategy::RowWise;
  bool diverged = false;   ///< the spec diverged at all (else nothing to fix, one trial)
  bool found = false;      ///< a fix made every batch size identical
  bool confirmed = false;  ///< ... in free mode over the whole generation too
  ops::OpPolicy fix;       ///< the minimal fix: one rule per family with its layer range
  std::string verdict;     ///< one plain sentence
  std::vector<CulpritTrial> trials;
  std::vector<CulpritCost> costs;
  double wall_s = 0.0;

  /// "Culprit: {selfcond_matmul} row_wise — with it B=2,4 are bitwise identical to B=1; cost
  /// +3.1 % at B=4", or the verdict when nothing was found.
  std::string headline(const std::vector<int>& batch_sizes) const;
};

struct ExperimentResult {
  ExperimentSpec spec;
  Provenance provenance;
  std::string config_json;             ///< the model's config.json
  std::string generation_config_json;  ///< what ran
  std::vector<std::int64_t> prompt_ids;
  std::string prompt_text;        ///< the prompt as the model saw it (decoded)
  std::vector<std::string> taps;  ///< tap names, the T axis
  int layers = 0;
  std::int64_t canvas_length = 0;
  std::int64_t top_k = 0;
  std::vector<RunResult> runs;
  std::vector<ComparisonResult> comparisons;
  /// The culprit finder's report (analysis/culprit.h), when this experiment came from it.
  std::optional<CulpritReport> culprit;
  /// Which kernels each op family launched per engine (experiment/kernel_provenance.h), when the
  /// spec asked for it (ExperimentSpec::kernels).
  std::optional<KernelProvenance> kernels;
  /// A mixed batch's causes (experiment/causes.h): the row under test's layout in every batched
  /// run (the runner), and the re-runs' verdict when analysis::find_causes ran.
  std::optional<CauseReport> causes;
  /// The exact (fp64) reference at each diverging comparison's first divergence
  /// (experiment/exact_reference.h), when analysis::exact_at_divergence ran.
  std::optional<ExactReport> exact;

  /// Where run_experiment spent its wall time, in seconds. Measured in this process and never
  /// written to files (a file read back has zeros).
  struct Timings {
    double prepare_s = 0.0;  ///< the tokenizer and inputs, before the model
    double load_s = 0.0;     ///< loading or building the model
    double engines_s = 0.0;  ///< the engines' own work (prefill, steps, commits)
    /// Per tick: queueing the row-0 copies and the tap comparisons (on a GPU their kernels run
    /// asynchronously: their device time shows in engines_s, at the engines' next sync), and
    /// reading the results back once per canvas.
    double comparisons_s = 0.0;
    double readback_s = 0.0;  ///< of comparisons_s: reading the results back per canvas
    double results_s = 0.0;   ///< assembling runs and comparisons after each group
    double kernels_s = 0.0;   ///< recording kernel provenance (ExperimentSpec::kernels)
    double causes_s = 0.0;    ///< analysis::find_causes's re-runs (a mixed batch)
    double exact_s = 0.0;     ///< analysis::exact_at_divergence (its re-run and fp64 products)
  } timings;

  const RunResult* run(const std::string& id) const;
  const ComparisonResult* comparison(const std::string& id) const;
};

/// "canvas 1 · step 2, layer 3 attn.q, position 17" (canvases and steps counted from 1, layers
/// and positions indexed from 0: story.h), or "none (bitwise identical ...)".
std::string describe(const Divergence& divergence);

/// At the last compared step: the share of canvas positions whose token scores (logits) differ
/// at all, and the share of token-score elements that differ. Zero when logits were not tapped.
/// Every element is read bounds-checked: `readable` is false (and the shares zero) when the
/// comparison's arrays do not hold the shapes they claim.
struct LastStepDiff {
  double positions = 0;
  double scores = 0;
  bool readable = true;
};
LastStepDiff last_step_logit_diff(const ExperimentResult& result,
                                  const ComparisonResult& comparison);

}  // namespace batchlens::experiment
