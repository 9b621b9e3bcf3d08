// SPDX-License-Identifier: Apache-2.0
#include "core/generation/generation_config.h"

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/support/special_files.h"

namespace batchlens::generation {
namespace {

// The released file as the converter writes it (spec §1.3).
constexpr const char* kReleased = R"({
  "max_new_tokens": 256, "max_denoising_steps": 48,
  "sampler_config": {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.1},
  "t_min": 0.4, "t_max": 0.8, "stability_threshold": 1, "confidence_threshold": 0.005,
  "eos_token_id": [1, 106, 50], "pad_token_id": 0, "transformers_version": "5.17.0"})";

TEST(GenerationConfig, ReadsTheReleasedFile) {
  auto c = parse_generation_config(kReleased);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c.value().max_new_tokens, 256);
  EXPECT_EQ(c.value().sampler.max_denoising_steps, 48);
  EXPECT_DOUBLE_EQ(c.value().sampler.entropy_bound, 0.1);
  EXPECT_DOUBLE_EQ(c.value().sampler.t_min, 0.4);
  EXPECT_DOUBLE_EQ(c.value().sampler.t_max, 0.8);
  EXPECT_EQ(c.value().sampler.stability_threshold, 1);
  EXPECT_DOUBLE_EQ(c.value().sampler.confidence_threshold, 0.005);
  EXPECT_EQ(c.value().eos_token_ids, (std::vector<std::int64_t>{1, 106, 50}));
  EXPECT_EQ(c.value().pad_token_id, 0);
}

TEST(GenerationConfig, AbsentFieldsKeepTheDefaultsAndAScalarEosIsAList) {
  auto c = parse_generation_config(R"({"max_denoising_steps": 12, "eos_token_id": 7})");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c.value().sampler.max_denoising_steps, 12);
  EXPECT_EQ(c.value().max_new_tokens, 256);
  EXPECT_EQ(c.value().eos_token_ids, (std::vector<std::int64_t>{7}));
}

TEST(GenerationConfig, RefusesWhatTheReferenceRefuses) {
  for (const char* bad :
       {R"({"t_min": 0.9, "t_max": 0.8})", R"({"max_denoising_steps": 0})",
        R"({"confidence_threshold": 0})", R"({"stability_threshold": -1})",
        R"({"max_new_tokens": -3})", R"({"sampler_config": {"entropy_bound": 0.0}})",
        R"({"sampler_config": {"_cls_name": "TopKSamplerConfig"}})"}) {
    auto c = parse_generation_config(bad);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.error().code, base::ErrorCode::InvalidArgument) << bad;
  }
  for (const char* broken : {"{", R"({"t_min": "low"})", "[]"}) {
    auto c = parse_generation_config(broken);
    ASSERT_FALSE(c.ok()) << broken;
    EXPECT_EQ(c.error().code, base::ErrorCode::FileCorrupted) << broken;
  }
}

// The fuzzer (CI, generation_config target) found -9.2e20 as an eos_token_id: converting it to an
// integer was undefined behaviour (UBSan). Numbers that do not fit the field are refused.
TEST(GenerationConfig, NumbersThatDoNotFitTheirFieldAreRefused) {
  for (const char* bad :
       {R"({"eos_token_id": [-922337203685477580850]})", R"({"eos_token_id": 1.5})",
        R"({"max_denoising_steps": 1e30})", R"({"max_new_tokens": 18446744073709551615})",
        R"({"max_denoising_steps": 4294967296})", R"({"t_min": "0.4"})"}) {
    const auto c = parse_generation_config(bad);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.error().code, base::ErrorCode::FileCorrupted) << bad;
    EXPECT_NE(c.error().message.find("generation config"), std::string::npos) << bad;
  }
  const auto ok = parse_generation_config(R"({"max_denoising_steps": 12, "t_min": 0, "t_max": 1})");
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok.value().sampler.max_denoising_steps, 12);
  EXPECT_DOUBLE_EQ(ok.value().sampler.t_max, 1.0);  // an integer where a float goes
}

TEST(GenerationConfig, OverridesApplyOverTheFileAndAreValidated) {
  GenerationOverrides o;
  o.max_denoising_steps = 8;
  o.t_max = 1.5;
  auto c = apply(o, GenerationConfig{});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c.value().sampler.max_denoising_steps, 8);
  EXPECT_DOUBLE_EQ(c.value().sampler.t_max, 1.5);
  EXPECT_DOUBLE_EQ(c.value().sampler.t_min, 0.4);
  o.t_min = 2.0;
  EXPECT_FALSE(apply(o, GenerationConfig{}).ok());
}

TEST(GenerationConfig, FileRoundTripAndMissingFileGivesDefaults) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / "gencfg_roundtrip";
  std::filesystem::create_directories(dir);
  std::filesystem::remove(dir / "generation_config.json");
  auto defaults = load_generation_config(dir);
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults.value().eos_token_ids, (std::vector<std::int64_t>{1, 106, 50}));
  GenerationConfig c;
  c.sampler.max_denoising_steps = 17;
  c.eos_token_ids = {1, 5};
  std::ofstream(dir / "generation_config.json") << to_json(c);
  auto back = load_generation_config(dir);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back.value().sampler.max_denoising_steps, 17);
  EXPECT_EQ(back.value().eos_token_ids, (std::vector<std::int64_t>{1, 5}));
  std::ofstream(dir / "generation_config.json") << "{\"t_min\": ";
  auto broken = load_generation_config(dir);
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.error().message.find("generation_config.json"), std::string::npos);
}

// issue #14: nesting is limited, and nothing of the document goes into the message.
TEST(GenerationConfig, DeeplyNestedJsonIsRefused) {
  const std::size_t depth = 100000;
  for (const std::string& text :
       {std::string(depth, '[') + std::string(depth, ']'),
        R"({"sampler_config": )" + std::string(depth, '[') + std::string(depth, ']') + "}",
        R"({"t_min": ")" + std::string(depth, '[') + "\"}"}) {  // brackets in a string are fine
    auto c = parse_generation_config(text);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.error().code, base::ErrorCode::FileCorrupted);
    EXPECT_EQ(c.error().message.find("[["), std::string::npos) << c.error().message;
    EXPECT_LT(c.error().message.size(), 200U);
  }
  EXPECT_NE(parse_generation_config(std::string(depth, '[') + std::string(depth, ']'))
                .error()
                .message.find("more than 64 deep"),
            std::string::npos);
}

// issue #14: a FIFO as generation_config.json is refused, not waited on.
TEST(GenerationConfig, FifoIsRefusedWithoutBlocking) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / "gencfg_fifo";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto path = dir / "generation_config.json";
  batchlens::test::make_fifo(path);
  const base::Error error =
      batchlens::test::expect_refused_without_blocking(path, [&]() -> base::Result<void> {
        auto c = load_generation_config(dir);
        if (!c.ok()) {
          return c.error();
        }
        return {};
      });
  EXPECT_EQ(error.code, base::ErrorCode::FileUnrecognised);
  EXPECT_NE(error.message.find("FIFO"), std::string::npos) << error.message;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace batchlens::generation
