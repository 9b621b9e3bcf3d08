// SPDX-License-Identifier: Apache-2.0
#include "core/ops/policy.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "tests/support/special_files.h"

namespace batchlens::ops {
namespace {

TEST(OpFamily, NamesRoundTripAndAreUnique) {
  std::set<std::string> names;
  for (OpFamily f : all_families()) {
    const auto name = std::string(family_name(f));
    EXPECT_TRUE(names.insert(name).second) << name;
    EXPECT_EQ(family_from_name(name), f);
    EXPECT_FALSE(family_label(f).empty());
  }
  EXPECT_EQ(names.size(), static_cast<std::size_t>(kOpFamilyCount));
  EXPECT_FALSE(family_from_name("no_such_op").has_value());
  EXPECT_FALSE(family_is_per_layer(OpFamily::SelfCondMatmul));
  EXPECT_TRUE(family_is_per_layer(OpFamily::RouterProj));
}

TEST(OpPolicy, DefaultIsBatchedEverywhere) {
  const OpPolicy p = OpPolicy::default_policy();
  EXPECT_TRUE(p.is_default());
  for (OpFamily f : all_families()) {
    EXPECT_EQ(p.resolve(f, 3), Strategy::Batched);
  }
}

TEST(OpPolicy, IssueWorkaroundIsRouterAndSelfCondMatmul) {
  const OpPolicy p = OpPolicy::issue_workaround();
  for (int layer : {0, 5, 29}) {
    EXPECT_EQ(p.resolve(OpFamily::RouterProj, layer), Strategy::RowWise);
    EXPECT_EQ(p.resolve(OpFamily::QProj, layer), Strategy::Batched);
    EXPECT_EQ(p.resolve(OpFamily::ExpertGateUp, layer), Strategy::Batched);
  }
  EXPECT_EQ(p.resolve(OpFamily::SelfCondMatmul, -1), Strategy::RowWise);
  EXPECT_EQ(p.resolve(OpFamily::LmHead, -1), Strategy::Batched);
}

TEST(OpPolicy, LayerRangesAndLastRuleWins) {
  OpPolicy p;
  FamilySet router;
  router.set(static_cast<std::size_t>(OpFamily::RouterProj));
  p.rules.push_back(PolicyRule{router, 2, 4, Strategy::RowWise});
  EXPECT_EQ(p.resolve(OpFamily::RouterProj, 1), Strategy::Batched);
  EXPECT_EQ(p.resolve(OpFamily::RouterProj, 2), Strategy::RowWise);
  EXPECT_EQ(p.resolve(OpFamily::RouterProj, 4), Strategy::RowWise);
  EXPECT_EQ(p.resolve(OpFamily::RouterProj, 5), Strategy::Batched);
  p.rules.push_back(PolicyRule{router, 3, 3, Strategy::Batched});
  EXPECT_EQ(p.resolve(OpFamily::RouterProj, 3), Strategy::Batched);
  EXPECT_EQ(p.resolve(OpFamily::RouterProj, 4), Strategy::RowWise);
}

TEST(OpPolicy, JsonRoundTripAndErrors) {
  OpPolicy p = OpPolicy::issue_workaround();
  FamilySet attn;
  attn.set(static_cast<std::size_t>(OpFamily::Attention));
  p.rules.push_back(PolicyRule{attn, 1, 7, Strategy::RowWise});
  const auto back = policy_from_json(to_json(p));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back.value().name, p.name);
  ASSERT_EQ(back.value().rules.size(), 2U);
  EXPECT_EQ(back.value().rules[1].families, attn);
  EXPECT_EQ(back.value().rules[1].last_layer, 7);
  EXPECT_EQ(describe(p),
            "issue_workaround: row_wise {router_proj, selfcond_matmul} row_wise {attention} "
            "layers 1..7");

  const auto unknown = policy_from_json(
      nlohmann::json::parse(R"({"rules": [{"families": ["router_projection"]}]})"));
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("router_projection"), std::string::npos);
  EXPECT_FALSE(policy_from_json(nlohmann::json::parse(R"({"rules": 3})")).ok());
  EXPECT_FALSE(policy_from_json(
                   nlohmann::json::parse(R"({"rules": [{"families": [], "strategy": "fast"}]})"))
                   .ok());
}

TEST(OpPolicy, FamilyListsAreNamedPoliciesForBothFixStrategies) {
  const OpPolicy sc = policy_from_text("batch_invariant:selfcond_matmul").value();
  EXPECT_EQ(sc.resolve(OpFamily::SelfCondMatmul, -1), Strategy::BatchInvariant);
  EXPECT_EQ(sc.resolve(OpFamily::RouterProj, 0), Strategy::Batched);
  EXPECT_EQ(policy_text(sc), "batch_invariant:selfcond_matmul");  // round trip by name
  const OpPolicy pair = policy_from_text("row_wise:router_proj,selfcond_matmul").value();
  EXPECT_EQ(pair.resolve(OpFamily::RouterProj, 5), Strategy::RowWise);
  EXPECT_EQ(pair.resolve(OpFamily::SelfCondMatmul, -1), Strategy::RowWise);
  EXPECT_EQ(pair.resolve(OpFamily::LmHead, -1), Strategy::Batched);
  EXPECT_EQ(families_with(pair, Strategy::RowWise),
            families_with(OpPolicy::issue_workaround(), Strategy::RowWise));
  const OpPolicy both =
      policy_from_text("row_wise:router_proj+batch_invariant:selfcond_matmul").value();
  EXPECT_EQ(both.resolve(OpFamily::RouterProj, 1), Strategy::RowWise);
  EXPECT_EQ(both.resolve(OpFamily::SelfCondMatmul, -1), Strategy::BatchInvariant);
  for (const char* bad : {"row_wise:", "row_wise:q_proj,", "batch_invariant:nope"}) {
    const auto r = policy_from_text(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message.find("unknown op family"), std::string::npos) << r.error().message;
  }
}

}  // namespace
}  // namespace batchlens::ops

namespace batchlens::ops {
namespace {

TEST(OpPolicy, ByNameOrJsonFile) {
  EXPECT_TRUE(policy_from_argument("default").value().is_default());
  EXPECT_EQ(policy_from_argument("issue_workaround").value().name, "issue_workaround");
  EXPECT_EQ(policy_from_argument("row_wise_all").value().resolve(OpFamily::LmHead, -1),
            Strategy::RowWise);
  const auto missing = policy_from_argument("no_such_policy");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("expected default"), std::string::npos);

  const std::string path = ::testing::TempDir() + "/bl_policy_test.json";
  { std::ofstream(path) << to_json(OpPolicy::issue_workaround()).dump(); }
  const auto from_file = policy_from_argument(path);
  ASSERT_TRUE(from_file.ok()) << from_file.error().message;
  EXPECT_EQ(from_file.value().resolve(OpFamily::RouterProj, 3), Strategy::RowWise);
  { std::ofstream(path) << "{ not json"; }
  const auto bad = policy_from_argument(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("not valid JSON"), std::string::npos);
  std::remove(path.c_str());
}

TEST(OpPolicy, InlineJson) {
  const auto inline_policy = policy_from_argument(
      R"({"name": "custom", "rules": [{"families": ["router_proj"], "first_layer": 2,)"
      R"( "last_layer": 3, "strategy": "row_wise"}]})");
  ASSERT_TRUE(inline_policy.ok()) << inline_policy.error().message;
  EXPECT_EQ(inline_policy.value().name, "custom");
  EXPECT_EQ(inline_policy.value().resolve(OpFamily::RouterProj, 2), Strategy::RowWise);
  EXPECT_EQ(inline_policy.value().resolve(OpFamily::RouterProj, 4), Strategy::Batched);
  const auto combined = policy_from_argument(
      R"(emulated_split_k+{"name": "c", "rules": [{"families": ["lm_head"]}]})");
  ASSERT_TRUE(combined.ok()) << combined.error().message;
  EXPECT_TRUE(combined.value().emulates(OpFamily::QProj));
  EXPECT_EQ(combined.value().resolve(OpFamily::LmHead, -1), Strategy::RowWise);
  const auto bad = policy_from_argument("{ not json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("inline policy"), std::string::npos);
}

// issue #15: specs and settings carry policies as text; every policy survives the round trip,
// and named ones keep their name (the files' spec JSON is unchanged).
TEST(OpPolicy, TextRoundTrip) {
  for (const OpPolicy& p :
       {OpPolicy::default_policy(), OpPolicy::issue_workaround(), OpPolicy::row_wise_all(),
        OpPolicy::emulated_split_k(), OpPolicy::emulation_profile("emulated_h200"),
        OpPolicy::emulation_profile("emulated_h100_report"),
        combine(OpPolicy::emulated_split_k(), OpPolicy::issue_workaround())}) {
    EXPECT_EQ(policy_text(p), p.name);
    const auto back = policy_from_text(policy_text(p));
    ASSERT_TRUE(back.ok()) << back.error().message;
    EXPECT_EQ(back.value(), p) << p.name;
  }
  EXPECT_EQ(policy_text(combine(OpPolicy::default_policy(), OpPolicy::issue_workaround())),
            "issue_workaround");
  OpPolicy custom;
  custom.name = "custom_row_wise";
  FamilySet lm_head;
  lm_head.set(static_cast<std::size_t>(OpFamily::LmHead));
  custom.rules.push_back({lm_head, 2, 5, Strategy::RowWise});
  custom.emulate_split_k = gemm_families();
  const std::string text = policy_text(custom);
  ASSERT_EQ(text.front(), '{');
  const auto back = policy_from_text(text);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back.value(), custom);
  // A policy named like a preset but with other rules is not mistaken for it.
  OpPolicy renamed = custom;
  renamed.name = "issue_workaround";
  EXPECT_EQ(policy_text(renamed).front(), '{');
  EXPECT_EQ(policy_from_text(policy_text(renamed)).value(), renamed);
  // Text never names a file: that is the command line's (policy_from_argument).
  EXPECT_FALSE(policy_from_text("/etc/passwd").ok());
}

// issue #14: inline and file policies are depth-limited; the message does not echo them.
TEST(OpPolicy, DeeplyNestedJsonIsRefused) {
  const std::string deep =
      "{\"rules\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  const auto inline_policy = policy_from_argument(deep);
  ASSERT_FALSE(inline_policy.ok());
  EXPECT_EQ(inline_policy.error().code, base::ErrorCode::InvalidArgument);
  EXPECT_NE(inline_policy.error().message.find("more than 64 deep"), std::string::npos)
      << inline_policy.error().message;
  EXPECT_EQ(inline_policy.error().message.find("[["), std::string::npos);

  const std::string path = ::testing::TempDir() + "/bl_policy_deep.json";
  { std::ofstream(path) << deep; }
  const auto from_file = policy_from_argument(path);
  ASSERT_FALSE(from_file.ok());
  EXPECT_NE(from_file.error().message.find("more than 64 deep"), std::string::npos);
  EXPECT_NE(from_file.error().message.find(path), std::string::npos);
  std::remove(path.c_str());

  // Fields of the wrong type are refused, not thrown.
  const auto typed =
      policy_from_argument(R"({"rules": [{"families": ["lm_head"], "strategy": 3}]})");
  ASSERT_FALSE(typed.ok());
  EXPECT_EQ(typed.error().code, base::ErrorCode::InvalidArgument);
  const auto huge_layer =
      policy_from_argument(R"({"rules": [{"families": ["lm_head"], "first_layer": 1e300}]})");
  ASSERT_FALSE(huge_layer.ok());
}

// issue #14: a FIFO given as the policy file is refused, not waited on.
// Policy texts come from other people's files (issue #32): a chain of 20,000 parts joined with
// + is refused with a message (it overflowed the stack), a chain within the bound combines as
// before, and layer bounds beyond int are refused instead of wrapped.
TEST(OpPolicy, LongChainsAndHugeLayerBoundsAreRefused) {
  std::string chain;
  for (int i = 0; i < 20000; ++i) {
    chain += "default+";
  }
  chain += "issue_workaround";
  const auto long_chain = policy_from_text(chain);
  ASSERT_FALSE(long_chain.ok());
  EXPECT_NE(long_chain.error().message.find("parts joined with +"), std::string::npos)
      << long_chain.error().message;
  EXPECT_FALSE(policy_from_text(std::string(20000, '+')).ok());
  EXPECT_FALSE(policy_from_text(std::string(kMaxPolicyTextBytes + 1, 'a')).ok());
  const auto three = policy_from_text("emulated_split_k+issue_workaround+row_wise:router_proj");
  ASSERT_TRUE(three.ok()) << three.error().message;
  EXPECT_EQ(three.value(), combine(policy_from_text("emulated_split_k").value(),
                                   combine(OpPolicy::issue_workaround(),
                                           policy_from_text("row_wise:router_proj").value())));
  EXPECT_EQ(three.value().name, "emulated_split_k+issue_workaround+row_wise:router_proj");
  // Inline JSON after a + runs to the end, even with a + inside it.
  const auto with_json = policy_from_text(
      R"(issue_workaround+{"name": "a+b", "rules": [{"families": ["router_proj"]}]})");
  ASSERT_TRUE(with_json.ok()) << with_json.error().message;
  EXPECT_EQ(with_json.value().name, "issue_workaround+a+b");
  for (const char* doc :
       {R"({"rules": [{"families": ["router_proj"], "first_layer": 2147483648}]})",
        R"({"rules": [{"families": ["router_proj"], "last_layer": 9223372036854775807}]})",
        R"({"rules": [{"families": ["router_proj"], "last_layer": 18446744073709551615}]})",
        R"({"rules": [{"families": ["router_proj"], "first_layer": -5}]})"}) {
    const auto p = policy_from_text(doc);
    ASSERT_FALSE(p.ok()) << doc;
    EXPECT_NE(p.error().message.find("must be an integer from -1 to"), std::string::npos)
        << p.error().message;
  }
  const auto fine = policy_from_text(
      R"({"rules": [{"families": ["router_proj"], "first_layer": 3, "last_layer": 7}]})");
  ASSERT_TRUE(fine.ok()) << fine.error().message;
  EXPECT_EQ(fine.value().rules[0].first_layer, 3);
  EXPECT_EQ(fine.value().rules[0].last_layer, 7);
}

TEST(OpPolicy, FifoIsRefusedWithoutBlocking) {
  const std::filesystem::path path =
      std::filesystem::path(::testing::TempDir()) / "bl_policy_fifo.json";
  batchlens::test::make_fifo(path);
  const base::Error error =
      batchlens::test::expect_refused_without_blocking(path, [&]() -> base::Result<void> {
        auto p = policy_from_argument(path.string());
        if (!p.ok()) {
          return p.error();
        }
        return {};
      });
  EXPECT_EQ(error.code, base::ErrorCode::FileUnrecognised);
  EXPECT_NE(error.message.find("FIFO"), std::string::npos) << error.message;
  std::filesystem::remove(path);
}

// issue #16: the CPU demo emulates only what diverged on the GPU it stands for, so the issue's
// workaround (row-wise router_proj + selfcond_matmul) covers every emulated family.
TEST(OpPolicy, EmulationProfilesFollowTheRecordedFindings) {
  const OpPolicy h200 = OpPolicy::emulation_profile("emulated_h200");
  EXPECT_TRUE(h200.emulates(OpFamily::SelfCondMatmul));
  EXPECT_EQ(h200.emulate_split_k.count(), 1U);
  const OpPolicy h100 = OpPolicy::emulation_profile("emulated_h100_report");
  EXPECT_TRUE(h100.emulates(OpFamily::RouterProj));
  EXPECT_TRUE(h100.emulates(OpFamily::SelfCondMatmul));
  EXPECT_EQ(h100.emulate_split_k.count(), 2U);
  const OpPolicy fix = OpPolicy::issue_workaround();
  for (const OpPolicy& p : {h200, h100}) {
    for (OpFamily f : all_families()) {
      if (p.emulates(f)) {
        EXPECT_EQ(fix.resolve(f, 0), Strategy::RowWise) << family_name(f);
      }
    }
  }
  EXPECT_EQ(emulation_profiles().front().name, "emulated_h200");
  EXPECT_EQ(find_emulation_profile("emulated_h300"), nullptr);
  EXPECT_FALSE(policy_from_text("emulated_h300").ok());
  EXPECT_EQ(OpPolicy::emulated_split_k().emulate_split_k, gemm_families());
}

}  // namespace
}  // namespace batchlens::ops

namespace batchlens::ops {
namespace {

TEST(OpPolicy, BatchInvariantIsAStrategyOfItsOwnInEveryFormOfAPolicy) {
  const OpPolicy all = policy_from_text("batch_invariant").value();
  EXPECT_EQ(all, OpPolicy::batch_invariant_all());
  EXPECT_EQ(all.resolve(OpFamily::SelfCondMatmul, -1), Strategy::BatchInvariant);
  EXPECT_EQ(all.resolve(OpFamily::RouterProj, 3), Strategy::BatchInvariant);
  EXPECT_EQ(policy_text(all), "batch_invariant");
  EXPECT_EQ(families_with(all, Strategy::BatchInvariant), FamilySet().set());
  EXPECT_TRUE(families_with(all, Strategy::RowWise).none());
  FamilySet router;
  router.set(static_cast<std::size_t>(OpFamily::RouterProj));
  const OpPolicy one = OpPolicy::batch_invariant(router, "bi_router");
  const auto back = policy_from_json(to_json(one));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back.value(), one);
  EXPECT_EQ(back.value().resolve(OpFamily::RouterProj, 0), Strategy::BatchInvariant);
  EXPECT_EQ(back.value().resolve(OpFamily::QProj, 0), Strategy::Batched);
  EXPECT_NE(describe(one).find("batch_invariant {router_proj}"), std::string::npos)
      << describe(one);
  const OpPolicy mixed = policy_from_text("emulated_h200+batch_invariant").value();
  EXPECT_TRUE(mixed.emulates(OpFamily::SelfCondMatmul));
  EXPECT_EQ(mixed.resolve(OpFamily::SelfCondMatmul, -1), Strategy::BatchInvariant);
  const auto bad = policy_from_json(nlohmann::json::parse(
      R"({"rules": [{"families": ["q_proj"], "strategy": "batch_invariantly"}]})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("batch_invariant"), std::string::npos);
}

}  // namespace
}  // namespace batchlens::ops
