// SPDX-License-Identifier: Apache-2.0
#include "core/text/token_diff.h"

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
