// SPDX-License-Identifier: Apache-2.0
#include "core/text/token_diff.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

namespace batchlens::text {
namespace {

using Op = TokenEdit::Op;

TEST(TokenDiff, AlignsInsertionsDeletionsAndReplacements) {
  const std::vector<std::int64_t> ref{1, 2, 3, 4, 5};
  const std::vector<std::int64_t> run{1, 9, 3, 4, 7, 5, 6};
  const auto d = token_diff(ref, run);
  // 1 = ; 2->9 replace ; 3 = ; 4 = ; +7 ; 5 = ; +6
  ASSERT_EQ(d.size(), 7U);
  EXPECT_EQ(d[0].op, Op::Equal);
  EXPECT_EQ(d[1].op, Op::Replace);
  EXPECT_EQ(d[1].ref_pos, 1);
  EXPECT_EQ(d[1].run_pos, 1);
  EXPECT_EQ(d[4].op, Op::Insert);
  EXPECT_EQ(d[4].run_pos, 4);
  EXPECT_EQ(d[6].op, Op::Insert);
  EXPECT_EQ(changed_count(d), 3);
  EXPECT_EQ(changed_count(token_diff(ref, ref)), 0);
  const auto del = token_diff({1, 2, 3}, {1, 3});
  ASSERT_EQ(del.size(), 3U);
  EXPECT_EQ(del[1].op, Op::Delete);
  EXPECT_EQ(del[1].ref_pos, 1);
  EXPECT_EQ(del[1].run_pos, -1);
}

// A shifted text: deletions at the start, insertions at the end. Six edits, but of the five
// tokens each text has only three change (issue #34 saw "427 of 256 tokens change").
TEST(TokenDiff, ChangedTokensNeverExceedTheLongerText) {
  const std::vector<std::int64_t> ref{8, 8, 8, 1, 2};
  const std::vector<std::int64_t> run{1, 2, 9, 9, 9};
  const auto d = token_diff(ref, run);
  EXPECT_EQ(std::count_if(d.begin(), d.end(), [](const TokenEdit& e) { return e.op != Op::Equal; }),
            6);
  EXPECT_EQ(changed_count(d), 3);
  EXPECT_EQ(changed_count(token_diff({1, 2, 3}, {})), 3);
  EXPECT_EQ(changed_count(token_diff({}, {4, 5})), 2);
  EXPECT_EQ(changed_count(token_diff({1, 2, 3}, {1, 3})), 1);
  // Seeded random pairs: never more than the longer text.
  std::uint64_t state = 0x9E3779B97F4A7C15ULL;
  auto next = [&state](std::int64_t bound) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::int64_t>((state >> 33) % static_cast<std::uint64_t>(bound));
  };
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<std::int64_t> a(static_cast<std::size_t>(next(40)));
    std::vector<std::int64_t> b(static_cast<std::size_t>(next(40)));
    for (auto& t : a) {
      t = next(4);
    }
    for (auto& t : b) {
      t = next(4);
    }
    const auto edits = token_diff(a, b);
    const auto changed = changed_count(edits);
    EXPECT_LE(changed, static_cast<std::int64_t>(std::max(a.size(), b.size())));
    EXPECT_GE(changed, 0);
    EXPECT_EQ(changed == 0, a == b);
  }
}

TEST(TokenDiff, HugeInputsFallBackToPositions) {
  std::vector<std::int64_t> a(5000, 1);
  std::vector<std::int64_t> b(5000, 1);
  b[10] = 2;
  const auto d = token_diff(a, b);
  ASSERT_EQ(d.size(), 5000U);
  EXPECT_EQ(d[10].op, Op::Replace);
  EXPECT_EQ(changed_count(d), 1);
}

}  // namespace
}  // namespace batchlens::text
