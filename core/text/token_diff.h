// SPDX-License-Identifier: Apache-2.0
// Token-level diff of two generated sequences (reference vs run). Torch-free.
#pragma once

#include <cstdint>
#include <vector>

namespace batchlens::text {

/// One aligned pair. Equal/Replace have both positions; Delete only ref_pos (the token is in
/// the reference only), Insert only run_pos; the other is -1.
struct TokenEdit {
  enum class Op : std::uint8_t { Equal = 0, Replace = 1, Delete = 2, Insert = 3 };
  Op op = Op::Equal;
  std::int64_t ref_pos = -1;
  std::int64_t run_pos = -1;
};

/// The alignment of `ref` and `run` by longest common subsequence, with a deletion directly
/// followed by an insertion shown as one Replace. Sequences whose product of lengths exceeds
/// 2^24 are aligned position by position (Equal or Replace, then the tail). Deterministic.
std::vector<TokenEdit> token_diff(const std::vector<std::int64_t>& ref,
                                  const std::vector<std::int64_t>& run);

/// How many tokens change: the tokens of the longer of the two texts that are not in their
/// common subsequence (max(ref, run) - Equal edits). Never more than either text's length
/// allows: a deletion at the start and an insertion at the end of the same shifted text are
/// 3 + 3 edits but 3 changed tokens of 5 (issue #34: "427 of 256 tokens change").
std::int64_t changed_count(const std::vector<TokenEdit>& edits);

}  // namespace batchlens::text
