// SPDX-License-Identifier: Apache-2.0
#include "core/probe/tap_names.h"

#include <set>
#include <string>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "core/probe/taps.h"

namespace batchlens::probe {
namespace {

TEST(TapNames, RoundTripUniqueAndClassified) {
  std::set<std::string> names;
  for (Tap t : all_taps()) {
    const std::string name(tap_name(t));
    EXPECT_TRUE(names.insert(name).second) << name;
    EXPECT_EQ(tap_from_name(name), t);
    EXPECT_FALSE(tap_label(t).empty());
  }
  EXPECT_EQ(tap_name(Tap::RouterScores), "router.scores");
  EXPECT_TRUE(tap_is_per_layer(Tap::MoeOut));
  EXPECT_FALSE(tap_is_per_layer(Tap::Logits));
  EXPECT_FALSE(tap_from_name("router.score").has_value());
}

TEST(TapRecorder, RecordsOnlyWhatItWantsAsCopies) {
  std::bitset<kTapCount> wanted;
  wanted.set(static_cast<std::size_t>(Tap::RouterScores));
  TapRecorder rec(wanted);
  EXPECT_TRUE(rec.wants(Tap::RouterScores, 3));
  EXPECT_FALSE(rec.wants(Tap::Logits, kNoLayer));
  at::Tensor t = at::ones({2, 2});
  rec.record(Tap::RouterScores, 3, t);
  t.fill_(5);  // the model may overwrite its buffers later
  ASSERT_TRUE(rec.get(Tap::RouterScores, 3).defined());
  EXPECT_EQ(rec.get(Tap::RouterScores, 3).sum().item<float>(), 4.0F);
  EXPECT_FALSE(rec.get(Tap::RouterScores, 2).defined());
}

}  // namespace
}  // namespace batchlens::probe
