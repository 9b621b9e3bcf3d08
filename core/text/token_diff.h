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

/// Edits that are not Equal.
std::int64_t changed_count(const std::vector<TokenEdit>& edits);

}  // namespace batchlens::text
