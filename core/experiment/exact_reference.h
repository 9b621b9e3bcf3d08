// SPDX-License-Identifier: Apache-2.0
// The exact reference at a divergence (issue #35), as a value of the experiment file (/exact):
// for each batch size whose row 0 left B=1, the first divergent op and the logits (lm_head) of
// that step recomputed in fp64 on the CPU from B=1's operands, and how far B=1's and B=N's
// results lie from it. "Which one is wrong?" is the first question about a bitwise difference;
// usually neither is. Computed by analysis::exact_at_divergence (analysis/repro.h). Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/base/error.h"

namespace batchlens::experiment {

/// How far B=1's and B=N's results of one op lie from its exact value: the op in fp64 on the CPU
/// from the same operands; ULPs in the results' dtype from exact rounded to it.
struct ExactDistance {
  bool computed = false;
  std::int64_t elements = 0;
  double max_ulp_one = 0.0;  ///< B=1
  double mean_ulp_one = 0.0;
  double max_ulp_batch = 0.0;  ///< row 0 of B=N
  double mean_ulp_batch = 0.0;
  double max_abs_one = 0.0;
  double max_abs_batch = 0.0;
  double closer_one = 0.0;    ///< share of elements where B=1 is closer to exact
  double closer_batch = 0.0;  ///< ... where B=N is
  double ties = 0.0;          ///< ... where both are as close (equal values included)

  /// "B=1: max 1 ULP, mean 0.31; B=4: max 2 ULP, mean 0.42; closer: B=1 on 12 %, B=4 on 9 %,
  /// equally close on 79 %".
  std::string text(std::int64_t batch) const;
  /// "B=4 is closer to exact (on 21 % of elements against 12 %)", "B=1 is closer ...", "both
  /// are as close"; "" when not computed.
  std::string closer_text(std::int64_t batch) const;
};

/// One op at the divergent step, computed alone at batch 1 and at B from B=1's operands.
struct ExactOp {
  std::string site;             ///< "selfcond_matmul", "router_proj layer 3", "lm_head"
  std::string op;               ///< "linear", "matmul", "grouped_mm"
  std::string dtype;            ///< of its result: "bf16"
  bool differs_alone = false;   ///< row 0 has other bits at B than at 1 on the same operands
  std::int64_t columns = 0;     ///< output columns compared with exact
  std::int64_t columns_of = 0;  ///< of this many (a sample of a wide op's columns)
  ExactDistance distance;
};

/// The exact reference of one comparison's first divergence.
struct ExactAtDivergence {
  std::string comparison;  ///< "ref__b4"
  std::int64_t batch = 0;
  int canvas = 0;                 ///< 0-based
  int step = 0;                   ///< 1-based, of the first divergence
  std::optional<ExactOp> op;      ///< the first op behind it that differs alone (else the first)
  std::optional<ExactOp> logits;  ///< lm_head at the same step
  std::string note;               ///< why one of them is missing; "" otherwise
};

/// Every diverging batch size's exact reference, in comparison order.
struct ExactReport {
  std::vector<ExactAtDivergence> comparisons;
  double wall_s = 0.0;

  /// The comparison's entry, or null.
  const ExactAtDivergence* find(const std::string& comparison) const;
};

/// "selfcond_matmul (matmul, bf16, differs alone): B=1: max 1 ULP ...; B=4 is closer ..." (the
/// sampled columns said when sampled).
std::string exact_op_text(const ExactOp& op, std::int64_t batch);

/// The lines a reader sees for one comparison: "the op: <exact_op_text>", "the step's logits:
/// ...", and the note when there is one.
std::vector<std::string> exact_lines(const ExactAtDivergence& e);

/// {"elements", "max_ulp_one", ...} (null when not computed): the distance as files and
/// repro.py's op.json hold it.
nlohmann::json to_json(const ExactDistance& distance);
nlohmann::json to_json(const ExactReport& report);
/// Inverse of to_json, for files: InvalidArgument naming the field on malformed input (at most
/// 4096 comparisons). Never throws.
base::Result<ExactReport> exact_from_json(const nlohmann::json& doc);

}  // namespace batchlens::experiment
