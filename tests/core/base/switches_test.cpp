// SPDX-License-Identifier: Apache-2.0
#include "core/base/switches.h"

#include <cstdlib>

#include <gtest/gtest.h>

namespace batchlens::base {
namespace {

// Sets environment variables for one test and restores them (tests run single-threaded here).
class SwitchesEnv : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const char* name :
         {"BATCHLENS_FUSED", "BATCHLENS_FUSED_OFF", "BATCHLENS_CUDA_GRAPHS", "BATCHLENS_BI_PLAN",
          "BATCHLENS_SIDE_BRANCHES", "BATCHLENS_EXPERT_WGMMA"}) {
      ::unsetenv(name);  // NOLINT(concurrency-mt-unsafe)
    }
  }
  static void set(const char* name, const char* value) {
    ::setenv(name, value, 1);  // NOLINT(concurrency-mt-unsafe)
  }
};

TEST_F(SwitchesEnv, DefaultsAllowEverythingAndDescribeNothing) {
  const Switches s = Switches::from_environment();
  EXPECT_TRUE(s.fused);
  EXPECT_TRUE(s.fused_off.empty());
  EXPECT_TRUE(s.cuda_graphs);
  EXPECT_EQ(s.bi_plan, BiPlan::Classes);
  EXPECT_FALSE(s.side_branches);
  EXPECT_FALSE(s.expert_wgmma);
  EXPECT_TRUE(s.fused_kernel("diff"));
  EXPECT_TRUE(s.kv_room());
  EXPECT_EQ(s.describe(), "");
}

TEST_F(SwitchesEnv, ReadsEachVariable) {
  set("BATCHLENS_FUSED_OFF", "diff,,norm");
  set("BATCHLENS_CUDA_GRAPHS", "0");
  const Switches s = Switches::from_environment();
  EXPECT_TRUE(s.fused);
  EXPECT_EQ(s.fused_off, (std::vector<std::string>{"diff", "norm"}));
  EXPECT_FALSE(s.fused_kernel("diff"));
  EXPECT_FALSE(s.fused_kernel("norm"));
  EXPECT_TRUE(s.fused_kernel("softcap"));
  EXPECT_FALSE(s.cuda_graphs);
  EXPECT_EQ(s.describe(), "BATCHLENS_FUSED_OFF=diff,norm; BATCHLENS_CUDA_GRAPHS=0");

  set("BATCHLENS_BI_PLAN", "fixed");
  EXPECT_EQ(Switches::from_environment().bi_plan, BiPlan::Fixed);
  EXPECT_EQ(Switches::from_environment().describe(),
            "BATCHLENS_FUSED_OFF=diff,norm; BATCHLENS_CUDA_GRAPHS=0; BATCHLENS_BI_PLAN=fixed");
  set("BATCHLENS_BI_PLAN", "timed");
  EXPECT_EQ(Switches::from_environment().bi_plan, BiPlan::Timed);
  EXPECT_EQ(Switches::from_environment().describe(),
            "BATCHLENS_FUSED_OFF=diff,norm; BATCHLENS_CUDA_GRAPHS=0; BATCHLENS_BI_PLAN=timed");

  set("BATCHLENS_SIDE_BRANCHES", "1");
  EXPECT_TRUE(Switches::from_environment().side_branches);
  EXPECT_EQ(Switches::from_environment().describe(),
            "BATCHLENS_FUSED_OFF=diff,norm; BATCHLENS_CUDA_GRAPHS=0; BATCHLENS_BI_PLAN=timed; "
            "BATCHLENS_SIDE_BRANCHES=1");
  set("BATCHLENS_EXPERT_WGMMA", "1");
  EXPECT_TRUE(Switches::from_environment().expert_wgmma);
  EXPECT_EQ(Switches::from_environment().describe(),
            "BATCHLENS_FUSED_OFF=diff,norm; BATCHLENS_CUDA_GRAPHS=0; BATCHLENS_BI_PLAN=timed; "
            "BATCHLENS_SIDE_BRANCHES=1; BATCHLENS_EXPERT_WGMMA=1");

  EXPECT_TRUE(Switches::from_environment().kv_room());
  set("BATCHLENS_FUSED_OFF", "diff,room");
  EXPECT_FALSE(Switches::from_environment().kv_room());
  EXPECT_TRUE(Switches::from_environment().fused_kernel("norm"));

  set("BATCHLENS_FUSED_OFF", "diff,norm");
  set("BATCHLENS_FUSED", "0");
  const Switches off = Switches::from_environment();
  EXPECT_FALSE(off.fused_kernel("softcap"));
  EXPECT_TRUE(off.kv_room()) << "the room is no kernel: only FUSED_OFF=room turns it off";
  EXPECT_EQ(off.describe().rfind("BATCHLENS_FUSED=0; ", 0), 0U) << off.describe();
}

TEST_F(SwitchesEnv, OnlyZeroTurnsThingsOff) {
  set("BATCHLENS_FUSED", "1");
  set("BATCHLENS_CUDA_GRAPHS", "yes");
  set("BATCHLENS_BI_PLAN", "yes");
  set("BATCHLENS_SIDE_BRANCHES", "yes");  // only 1 turns it on
  set("BATCHLENS_EXPERT_WGMMA", "yes");
  const Switches s = Switches::from_environment();
  EXPECT_FALSE(s.side_branches);
  EXPECT_FALSE(s.expert_wgmma);
  EXPECT_TRUE(s.fused);
  EXPECT_TRUE(s.cuda_graphs);
  EXPECT_EQ(s.bi_plan, BiPlan::Classes);
  EXPECT_EQ(s.describe(), "");
}

TEST(BiPlan, NamesRoundTrip) {
  for (const BiPlan p : {BiPlan::Classes, BiPlan::Timed, BiPlan::Fixed}) {
    const auto back = parse_bi_plan(bi_plan_name(p));
    ASSERT_TRUE(back.ok()) << bi_plan_name(p);
    EXPECT_EQ(back.value(), p);
  }
  for (const char* bad : {"Fixed", ""}) {
    const auto refused = parse_bi_plan(bad);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.error().message.find("expected classes, timed or fixed"), std::string::npos)
        << refused.error().message;
  }
}

}  // namespace
}  // namespace batchlens::base
