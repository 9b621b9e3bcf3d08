// SPDX-License-Identifier: Apache-2.0
// Which op families give row 0 the same bits at every batch size, measured on the model's own
// weights and shapes: with the kernels the default (batched) strategy uses, and with the
// batch-invariant strategy's kernels (with and without the emulated split-K). The batch-invariant
// strategy is refused for a family this check did not prove (ref: issue #17).
#pragma once

#include <string>
#include <vector>

#include "core/model/config.h"
#include "core/model/weights.h"
#include "core/ops/op_runner.h"
#include "core/ops/policy.h"

namespace batchlens::model {

struct BatchInvariance {
  std::vector<int> batch_sizes;      ///< the B checked (rows M = B x canvas length)
  ops::FamilySet proven;             ///< batch_invariant kept row 0 bitwise equal at every B
  ops::FamilySet default_invariant;  ///< the default (batched) kernels already did
  std::string report;                ///< one line per family group: what was measured
};

/// Measures it: for every op family, row block 0 of one call over B x C rows (C = the canvas
/// length; random inputs of the family's real width, each batch row offset so rows differ; its
/// layer-0 weight) against the same call at B = 1, for B in 1..64 on CUDA and
/// {1, 2, 3, 4, 5, 8, 16, 33, 64} on a CPU. On CUDA the weight's full width (the library picks
/// its kernel from it), on a CPU at most 64 output columns. The experts of the grouped_mm
/// implementation as it runs them (top-k pairs sorted by expert, one grouped GEMM); attention
/// with the layer's real heads over a prompt of 7 tokens plus the canvas. Seeded; synchronises.
/// What the measurement reads of a model: DiffusionGemma passes its own config and weights (on
/// their device and dtype) and whether its experts run as one grouped GEMM.
struct InvarianceSubject {
  const ModelConfig& config;
  const ModelWeights& weights;
  bool grouped_experts = false;
};
BatchInvariance measure_batch_invariance(const InvarianceSubject& model, ops::OwnGemms own);

}  // namespace batchlens::model
