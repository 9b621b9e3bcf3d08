// SPDX-License-Identifier: Apache-2.0
// Minimal repro export (issue #18): one op of an experiment, its row-0 inputs captured from the
// B=1 reference run at the step where it diverged, written to a folder a maintainer runs with
// plain PyTorch (repro.py, inputs.safetensors, op.json, README.md), no BatchLens and no
// checkpoint needed. The export first checks that the op alone reproduces: computed once at
// batch 1 and once with the row repeated to B, under the compared run's policy, by this build.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/analysis/exact.h"
#include "core/base/error.h"
#include "core/experiment/experiment.h"
#include "core/experiment/runner.h"

namespace batchlens::setup {
struct Session;
}

namespace batchlens::analysis {

/// What to export. Empty / -1 fields take the comparison's first divergence.
struct ReproRequest {
  std::string comparison;     ///< a row-0 comparison id; "" = the first that diverges (main first)
  std::string family;         ///< ops::family_name; "" = the first op behind the divergence that
                              ///< reproduces alone
  int layer = -1;             ///< with family, for per-layer families
  int canvas = -1;            ///< 0-based; -1 with step = the first divergence's
  int step = -1;              ///< 1-based step within the canvas
  std::filesystem::path out;  ///< the folder to write (made; a previous export there replaced)
  std::uint64_t max_bytes = std::uint64_t{64} << 20;  ///< cap on inputs.safetensors
  std::string source_file;  ///< the experiment file's path, quoted in README.md's commands
};

/// One tensor operand of the op.
struct ReproInput {
  std::string name;  ///< "x", "w", "offs"
  std::string role;  ///< "activation", "weight", "offsets"
  std::vector<std::int64_t> shape;
  std::string dtype;        ///< safetensors name: "BF16", "F32", "I32"
  bool included = false;    ///< in inputs.safetensors (else seeded random in the script)
  bool transposed = false;  ///< the op reads the stored tensor's transpose(-2, -1)
  std::string key;          ///< the checkpoint key of a weight, "" for activations
  std::string sha256;       ///< of the bytes as the op read them (contiguous, stored layout)
  std::uint64_t bytes = 0;
  double mean = 0.0;  ///< for seeded random stand-ins
  double std = 0.0;
  std::string random;  ///< "normal", "softmax" (probabilities over the last dim), "copy" (offs)
};

/// What was exported, and whether the op alone reproduces with this build.
struct ReproExport {
  std::filesystem::path dir;
  std::string comparison;
  std::string family;
  int layer = -1;
  int canvas = 0;
  int step = 0;
  std::string op;  ///< "linear", "matmul", "grouped_mm"
  std::int64_t batch = 1;
  std::string dtype;
  std::string device;
  bool emulated = false;  ///< the compared run emulated split-K for this family
  std::string policy;     ///< the compared run's policy (ops::policy_text)
  /// Row 0 of the op at B vs at 1 on the captured inputs, computed by this build.
  bool reproduces = false;
  double frac_differ = 0.0;
  double max_abs = 0.0;
  std::int64_t max_ulp = 0;
  /// The op's exact value (fp64, CPU, the captured operands) against both results.
  ExactDistance exact;
  std::vector<ReproInput> inputs;
  std::vector<std::string> candidates;  ///< ops behind the divergence tried, in pass order
  std::vector<std::string> notes;
};

/// Exports the repro of `req` for `shown` on `session` (its model, device and dtype). Errors:
/// InvalidArgument (no such comparison, no divergence and no step given, an op the pass does not
/// run at that step, attention (not exported), a folder that exists and holds something else);
/// those of observe_reference_step; IoFailed. Never throws. The folder is written complete or
/// not at all.
base::Result<ReproExport> export_repro(const setup::Session& session,
                                       const experiment::ExperimentResult& shown,
                                       const ReproRequest& req,
                                       const experiment::RunControl& control = {});

/// Opens a session for `shown`'s spec and exports there.
base::Result<ReproExport> export_repro(const experiment::ExperimentResult& shown,
                                       const ReproRequest& req,
                                       const experiment::RunControl& control = {});

/// The exact reference at each diverging row-0 comparison of `shown` at B > 1 (issue #35): B=1's
/// pass replayed to the first divergent step on `session`, the first op behind the divergence
/// that differs alone (else the first) and the step's lm_head each computed alone at 1 and at B
/// from B=1's operands and compared with the op in fp64 on the CPU (a wide op on a sample of
/// its output columns). A comparison whose ops cannot be recomputed gets a note. Errors:
/// Cancelled, OutOfMemory; those of observe_reference_step for a model that is not
/// `shown`'s. Never throws.
base::Result<experiment::ExactReport> exact_at_divergence(
    const setup::Session& session, const experiment::ExperimentResult& shown,
    const experiment::RunControl& control = {});

/// A few lines saying what was exported and how to run it.
std::string repro_text(const ReproExport& r);

/// The text of repro.py (embedded from resources/repro/repro.py).
std::string_view repro_script();

}  // namespace batchlens::analysis
