// SPDX-License-Identifier: Apache-2.0
#include "core/model/config.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/base/error.h"
#include "core/base/input.h"
#include "tests/support/special_files.h"

namespace batchlens::model {
namespace {

using base::ErrorCode;
using nlohmann::json;

constexpr LayerType kS = LayerType::Sliding;
constexpr LayerType kF = LayerType::Full;

ModelConfig preset(const std::string& name) {
  auto result = load_preset(name);
  EXPECT_TRUE(result.ok()) << name << ": " << (result.ok() ? "" : result.error().message);
  return std::move(result).value();
}

/// The 26b-a4b preset as a JSON document, for tests that break one field of a valid config.
json released_doc() {
  return to_json(preset("26b-a4b"));
}

/// A document with only the fields that have no usable reference default.
json minimal_doc() {
  return {
      {"text_config", {{"num_experts", 4}, {"top_k_experts", 2}, {"moe_intermediate_size", 8}}}};
}

void expect_same_rope(const RopeParams& a, const RopeParams& b, const std::string& what) {
  EXPECT_EQ(a.rope_type, b.rope_type) << what;
  EXPECT_EQ(a.rope_theta, b.rope_theta) << what;
  EXPECT_EQ(a.partial_rotary_factor, b.partial_rotary_factor) << what;
  EXPECT_EQ(a.factor, b.factor) << what;
}

/// Field-by-field equality of everything a config.json carries (not the display name).
void expect_same_config(const ModelConfig& a, const ModelConfig& b) {
  const TextConfig& x = a.text;
  const TextConfig& y = b.text;
  EXPECT_EQ(x.vocab_size, y.vocab_size);
  EXPECT_EQ(x.hidden_size, y.hidden_size);
  EXPECT_EQ(x.intermediate_size, y.intermediate_size);
  EXPECT_EQ(x.num_hidden_layers, y.num_hidden_layers);
  EXPECT_EQ(x.num_attention_heads, y.num_attention_heads);
  EXPECT_EQ(x.num_key_value_heads, y.num_key_value_heads);
  EXPECT_EQ(x.num_global_key_value_heads, y.num_global_key_value_heads);
  EXPECT_EQ(x.head_dim, y.head_dim);
  EXPECT_EQ(x.global_head_dim, y.global_head_dim);
  EXPECT_EQ(x.hidden_activation, y.hidden_activation);
  EXPECT_EQ(x.max_position_embeddings, y.max_position_embeddings);
  EXPECT_EQ(x.initializer_range, y.initializer_range);
  EXPECT_EQ(x.rms_norm_eps, y.rms_norm_eps);
  EXPECT_EQ(x.pad_token_id, y.pad_token_id);
  EXPECT_EQ(x.bos_token_id, y.bos_token_id);
  EXPECT_EQ(x.eos_token_ids, y.eos_token_ids);
  EXPECT_EQ(x.tie_word_embeddings, y.tie_word_embeddings);
  EXPECT_EQ(x.attention_bias, y.attention_bias);
  EXPECT_EQ(x.sliding_window, y.sliding_window);
  EXPECT_EQ(x.layer_types, y.layer_types);
  EXPECT_EQ(x.final_logit_softcapping, y.final_logit_softcapping);
  EXPECT_EQ(x.use_bidirectional_attention, y.use_bidirectional_attention);
  EXPECT_EQ(x.num_experts, y.num_experts);
  EXPECT_EQ(x.top_k_experts, y.top_k_experts);
  EXPECT_EQ(x.moe_intermediate_size, y.moe_intermediate_size);
  expect_same_rope(x.rope_sliding, y.rope_sliding, "rope_sliding");
  expect_same_rope(x.rope_full, y.rope_full, "rope_full");
  EXPECT_EQ(a.canvas_length, b.canvas_length);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
  EXPECT_EQ(a.boi_token_id, b.boi_token_id);
  EXPECT_EQ(a.eoi_token_id, b.eoi_token_id);
  EXPECT_EQ(a.image_token_id, b.image_token_id);
  EXPECT_EQ(a.dtype, b.dtype);
}

/// Parses `doc` and expects InvalidArgument whose message contains every part of `parts`.
void expect_invalid(const json& doc, const std::vector<std::string>& parts) {
  const auto result = parse_config(doc);
  ASSERT_FALSE(result.ok()) << "accepted: " << doc.dump();
  EXPECT_EQ(result.error().code, ErrorCode::InvalidArgument) << result.error().message;
  for (const auto& part : parts) {
    EXPECT_NE(result.error().message.find(part), std::string::npos)
        << "message: " << result.error().message << "\nmissing: " << part;
  }
}

/// A scratch directory for file tests, removed at the end of the test.
class ConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) /
           (std::string("batchlens_config_") + info->name()) / "my-checkpoint";
    std::filesystem::remove_all(dir_.parent_path());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_.parent_path()); }

  std::filesystem::path write(const std::string& text) const {
    auto path = dir_ / "config.json";
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  std::filesystem::path dir_;
};

// ---- Presets -----------------------------------------------------------------------------

TEST(ConfigPresets, NamesInSizeOrder) {
  EXPECT_EQ(preset_names(),
            (std::vector<std::string>{"tiny", "demo", "demo-trained", "mid", "26b-a4b"}));
}

TEST(ConfigPresets, EveryPresetLoadsAndValidates) {
  for (const auto& name : preset_names()) {
    const auto result = load_preset(name);
    ASSERT_TRUE(result.ok()) << name << ": " << result.error().message;
    EXPECT_EQ(result.value().name, name);
    EXPECT_NO_THROW(validate(result.value())) << name;
    // Every special id fits the vocabulary (validate checks it; spelled out for the presets).
    const ModelConfig& c = result.value();
    for (const auto& id : {c.boi_token_id, c.eoi_token_id, c.image_token_id}) {
      ASSERT_TRUE(id.has_value()) << name;
      EXPECT_LT(*id, c.text.vocab_size) << name;
    }
    for (const std::int64_t id : {c.text.pad_token_id, c.text.bos_token_id}) {
      EXPECT_LT(id, c.text.vocab_size) << name;
    }
  }
}

TEST(ConfigPresets, UnknownNameIsInvalidArgument) {
  const auto result = load_preset("27b");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().code, ErrorCode::InvalidArgument);
  EXPECT_NE(result.error().message.find("\"27b\""), std::string::npos);
  EXPECT_NE(result.error().message.find("26b-a4b"), std::string::npos);
}

TEST(ConfigPresets, Released26bA4bMatchesSpec) {
  const ModelConfig c = preset("26b-a4b");
  const TextConfig& t = c.text;
  EXPECT_EQ(t.vocab_size, 262144);
  EXPECT_EQ(t.hidden_size, 2816);
  EXPECT_EQ(t.intermediate_size, 2112);
  EXPECT_EQ(t.num_hidden_layers, 30);
  EXPECT_EQ(t.num_attention_heads, 16);
  EXPECT_EQ(t.num_key_value_heads, 8);
  EXPECT_EQ(t.num_global_key_value_heads, 2);
  EXPECT_EQ(t.head_dim, 256);
  EXPECT_EQ(t.global_head_dim, 512);
  EXPECT_EQ(t.sliding_window, 1024);
  EXPECT_EQ(t.max_position_embeddings, 262144);
  EXPECT_EQ(t.rms_norm_eps, 1e-6);
  EXPECT_EQ(t.hidden_activation, "gelu_pytorch_tanh");
  EXPECT_EQ(t.final_logit_softcapping, 30.0);
  EXPECT_EQ(t.num_experts, 128);
  EXPECT_EQ(t.top_k_experts, 8);
  EXPECT_EQ(t.moe_intermediate_size, 704);
  EXPECT_EQ(t.use_bidirectional_attention, "vision");
  EXPECT_TRUE(t.tie_word_embeddings);
  EXPECT_FALSE(t.attention_bias);
  EXPECT_EQ(t.pad_token_id, 0);
  EXPECT_EQ(t.eos_token_ids, (std::vector<std::int64_t>{1}));
  EXPECT_EQ(t.bos_token_id, 2);

  ASSERT_EQ(t.layer_types.size(), 30U);
  for (std::int64_t i = 0; i < 30; ++i) {
    EXPECT_EQ(t.layer_types[i], (i % 6 == 5) ? kF : kS) << "layer " << i;
  }
  // Layer 5: the first full layer, 512-wide heads, 2 kv heads, K doubles as V.
  EXPECT_FALSE(t.is_sliding(5));
  EXPECT_EQ(t.layer_head_dim(5), 512);
  EXPECT_EQ(t.layer_kv_heads(5), 2);
  EXPECT_FALSE(t.layer_has_v_proj(5));
  // Layer 4: sliding, 256-wide heads, 8 kv heads, its own v_proj.
  EXPECT_TRUE(t.is_sliding(4));
  EXPECT_EQ(t.layer_head_dim(4), 256);
  EXPECT_EQ(t.layer_kv_heads(4), 8);
  EXPECT_TRUE(t.layer_has_v_proj(4));
  EXPECT_FALSE(t.is_sliding(29));

  EXPECT_EQ(t.rope_sliding.rope_type, "default");
  EXPECT_EQ(t.rope_sliding.rope_theta, 10000.0);
  EXPECT_EQ(t.rope_sliding.partial_rotary_factor, 1.0);
  EXPECT_EQ(t.rope_full.rope_type, "proportional");
  EXPECT_EQ(t.rope_full.rope_theta, 1000000.0);
  EXPECT_EQ(t.rope_full.partial_rotary_factor, 0.25);
  EXPECT_EQ(t.rope_full.factor, 1.0);

  EXPECT_EQ(c.canvas_length, 256);
  EXPECT_EQ(c.eos_token_ids, (std::vector<std::int64_t>{1, 106}));
  EXPECT_EQ(c.boi_token_id, 255999);
  EXPECT_EQ(c.eoi_token_id, 258882);
  EXPECT_EQ(c.image_token_id, 258880);
  EXPECT_EQ(c.dtype, "bfloat16");
}

TEST(ConfigPresets, MidShapes) {
  const ModelConfig c = preset("mid");
  const TextConfig& t = c.text;
  EXPECT_EQ(t.vocab_size, 32768);
  EXPECT_EQ(t.hidden_size, 1024);
  EXPECT_EQ(t.intermediate_size, 2048);
  EXPECT_EQ(t.num_hidden_layers, 8);
  EXPECT_EQ(t.layer_types, (std::vector<LayerType>{kS, kS, kS, kS, kS, kF, kS, kF}));
  EXPECT_EQ(t.num_attention_heads, 8);
  EXPECT_EQ(t.layer_kv_heads(0), 4);
  EXPECT_EQ(t.layer_kv_heads(5), 2);
  EXPECT_EQ(t.layer_head_dim(6), 128);
  EXPECT_EQ(t.layer_head_dim(7), 256);
  EXPECT_EQ(t.num_experts, 32);
  EXPECT_EQ(t.top_k_experts, 4);
  EXPECT_EQ(t.moe_intermediate_size, 512);
  EXPECT_EQ(t.sliding_window, 1024);
  EXPECT_EQ(t.rope_full.rope_type, "proportional");
  EXPECT_EQ(t.rope_full.partial_rotary_factor, 0.25);
  EXPECT_EQ(c.canvas_length, 128);
  EXPECT_EQ(c.eos_token_ids, (std::vector<std::int64_t>{1, 106}));
}

TEST(ConfigPresets, DemoAndTinyShapes) {
  const ModelConfig demo = preset("demo");
  EXPECT_EQ(demo.text.vocab_size, 4096);
  EXPECT_EQ(demo.text.hidden_size, 128);
  EXPECT_EQ(demo.text.layer_types, (std::vector<LayerType>{kS, kS, kS, kS, kS, kF}));
  EXPECT_EQ(demo.text.layer_kv_heads(5), 1);
  EXPECT_EQ(demo.text.layer_head_dim(5), 64);
  EXPECT_EQ(demo.text.num_experts, 16);
  EXPECT_EQ(demo.canvas_length, 32);

  const ModelConfig tiny = preset("tiny");
  const TextConfig& t = tiny.text;
  EXPECT_EQ(t.vocab_size, 384);
  EXPECT_EQ(t.hidden_size, 64);
  EXPECT_EQ(t.intermediate_size, 96);
  EXPECT_EQ(t.layer_types, (std::vector<LayerType>{kS, kS, kS, kF}));
  EXPECT_EQ(t.num_attention_heads, 4);
  EXPECT_EQ(t.layer_kv_heads(0), 2);
  EXPECT_EQ(t.layer_kv_heads(3), 1);
  EXPECT_EQ(t.layer_head_dim(0), 16);
  EXPECT_EQ(t.layer_head_dim(3), 32);
  EXPECT_EQ(t.sliding_window, 16);
  EXPECT_EQ(t.num_experts, 8);
  EXPECT_EQ(t.top_k_experts, 2);
  EXPECT_EQ(t.moe_intermediate_size, 32);
  EXPECT_EQ(t.max_position_embeddings, 4096);
  EXPECT_EQ(tiny.canvas_length, 16);
  EXPECT_EQ(tiny.eos_token_ids, (std::vector<std::int64_t>{1}));
}

// ---- Parsing semantics -------------------------------------------------------------------

TEST(ConfigParse, AbsentFieldsTakeReferenceDefaults) {
  const auto result = parse_config(minimal_doc());
  ASSERT_TRUE(result.ok()) << result.error().message;
  const ModelConfig& c = result.value();
  const TextConfig& t = c.text;
  EXPECT_EQ(t.vocab_size, 262144);
  EXPECT_EQ(t.hidden_size, 2304);
  EXPECT_EQ(t.intermediate_size, 9216);
  EXPECT_EQ(t.num_hidden_layers, 30);
  EXPECT_EQ(t.num_attention_heads, 8);
  EXPECT_EQ(t.num_key_value_heads, 4);
  EXPECT_EQ(t.num_global_key_value_heads, 0);
  EXPECT_EQ(t.layer_kv_heads(5), 4);  // no global override: full layers keep 4
  EXPECT_EQ(t.head_dim, 256);
  EXPECT_EQ(t.global_head_dim, 512);
  EXPECT_EQ(t.max_position_embeddings, 131072);
  EXPECT_EQ(t.sliding_window, 512);
  EXPECT_EQ(t.final_logit_softcapping, 30.0);
  EXPECT_EQ(t.use_bidirectional_attention, "");
  EXPECT_EQ(t.rope_sliding.rope_type, "default");
  EXPECT_EQ(t.rope_sliding.rope_theta, 10000.0);
  EXPECT_EQ(t.rope_full.rope_type, "proportional");
  EXPECT_EQ(t.rope_full.partial_rotary_factor, 0.25);
  EXPECT_EQ(t.rope_full.rope_theta, 1000000.0);
  EXPECT_EQ(c.canvas_length, 256);
  EXPECT_EQ(c.boi_token_id, 255999);
  EXPECT_EQ(c.eoi_token_id, 258882);
  EXPECT_EQ(c.image_token_id, 258880);
  EXPECT_EQ(c.eos_token_ids, t.eos_token_ids);  // top level falls back to text_config's ids
  EXPECT_EQ(c.dtype, "bfloat16");
  EXPECT_TRUE(c.name.empty());
}

TEST(ConfigParse, DefaultLayerPatternIsFiveSlidingOneFull) {
  json doc = minimal_doc();
  doc["text_config"]["num_hidden_layers"] = 14;
  const auto result = parse_config(doc);
  ASSERT_TRUE(result.ok()) << result.error().message;
  // Full at (i+1) % 6 == 0, i.e. 5 and 11; the last layer (13) forced to full.
  EXPECT_EQ(result.value().text.layer_types,
            (std::vector<LayerType>{kS, kS, kS, kS, kS, kF, kS, kS, kS, kS, kS, kF, kS, kF}));
}

TEST(ConfigParse, LastLayerIsForcedToFull) {
  json doc = minimal_doc();
  doc["text_config"]["num_hidden_layers"] = 3;
  doc["text_config"]["layer_types"] = {"full_attention", "sliding_attention", "sliding_attention"};
  const auto result = parse_config(doc);
  ASSERT_TRUE(result.ok()) << result.error().message;
  EXPECT_EQ(result.value().text.layer_types, (std::vector<LayerType>{kF, kS, kF}));
}

TEST(ConfigParse, BidirectionalAllShrinksSlidingWindow) {
  json doc = minimal_doc();
  doc["text_config"]["sliding_window"] = 1024;
  doc["text_config"]["use_bidirectional_attention"] = "all";
  auto result = parse_config(doc);
  ASSERT_TRUE(result.ok()) << result.error().message;
  // ref: DiffusionGemmaTextConfig.__post_init__: 1024 // 2 + 1
  EXPECT_EQ(result.value().text.sliding_window, 513);
  // Written back as the pre-conversion value, exactly as the reference's to_dict does.
  const json out = to_json(result.value());
  EXPECT_EQ(out["text_config"]["sliding_window"], 1024);
  const auto again = parse_config(out);
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again.value().text.sliding_window, 513);

  // An odd window loses its low bit in the reference too, and then stays put.
  doc["text_config"]["sliding_window"] = 7;
  result = parse_config(doc);
  ASSERT_TRUE(result.ok()) << result.error().message;
  EXPECT_EQ(result.value().text.sliding_window, 4);
  EXPECT_EQ(parse_config(to_json(result.value())).value().text.sliding_window, 4);

  // "vision" leaves the window alone.
  doc["text_config"]["use_bidirectional_attention"] = "vision";
  EXPECT_EQ(parse_config(doc).value().text.sliding_window, 7);
}

TEST(ConfigParse, AcceptsHfVariantsAndIgnoresUnknownKeys) {
  json doc = minimal_doc();
  doc["torch_dtype"] = "float32";
  doc["eos_token_id"] = 106;
  doc["vision_config"] = {{"model_type", "gemma4_vision"}, {"hidden_size", 1152}};
  doc["transformers_version"] = "5.17.0";
  doc["architectures"] = {"DiffusionGemmaForBlockDiffusion"};
  doc["text_config"]["eos_token_id"] = {1, 106, 50};
  doc["text_config"]["num_global_key_value_heads"] = nullptr;
  doc["text_config"]["use_bidirectional_attention"] = nullptr;
  doc["text_config"]["attention_dropout"] = 0.0;
  doc["text_config"]["some_future_field"] = {{"x", 1}};
  doc["text_config"]["rope_parameters"] = {
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 5000}}},
      {"full_attention", {{"rope_type", "proportional"}, {"rope_theta", 2e6}, {"factor", 8.0}}}};
  const auto result = parse_config(doc);
  ASSERT_TRUE(result.ok()) << result.error().message;
  const ModelConfig& c = result.value();
  EXPECT_EQ(c.dtype, "float32");
  EXPECT_EQ(c.eos_token_ids, (std::vector<std::int64_t>{106}));
  EXPECT_EQ(c.text.eos_token_ids, (std::vector<std::int64_t>{1, 106, 50}));
  EXPECT_EQ(c.text.num_global_key_value_heads, 0);
  EXPECT_EQ(c.text.rope_sliding.rope_theta, 5000.0);
  // Inside a given rope entry, absent factors are 1.0 (the reference's .get(..., 1.0)).
  EXPECT_EQ(c.text.rope_full.partial_rotary_factor, 1.0);
  EXPECT_EQ(c.text.rope_full.factor, 8.0);
  EXPECT_EQ(c.text.rope_full.rope_theta, 2e6);

  // "dtype" wins over the legacy "torch_dtype".
  doc["dtype"] = "float16";
  EXPECT_EQ(parse_config(doc).value().dtype, "float16");
}

TEST(ConfigParse, ReadsPerLayerConfigAsWrittenByTransformers) {
  // transformers 5.17's to_dict writes per_layer_config instead of global_head_dim and
  // num_global_key_value_heads; this is its output for the mid preset.
  json doc = to_json(preset("mid"));
  json& text = doc["text_config"];
  text.erase("global_head_dim");
  text.erase("num_global_key_value_heads");
  text["per_layer_config"] = json::parse(R"({"5": {"head_dim": 256, "num_key_value_heads": 2},
                                             "7": {"head_dim": 256, "num_key_value_heads": 2}})");
  auto result = parse_config(doc);
  ASSERT_TRUE(result.ok()) << result.error().message;
  expect_same_config(result.value(), preset("mid"));

  // When present it wins over the kwargs, as in the reference's __post_init__.
  text["global_head_dim"] = 64;
  text["num_global_key_value_heads"] = 1;
  result = parse_config(doc);
  ASSERT_TRUE(result.ok()) << result.error().message;
  EXPECT_EQ(result.value().text.global_head_dim, 256);
  EXPECT_EQ(result.value().text.layer_kv_heads(7), 2);

  // No entries: full layers take the base shape.
  json tiny = to_json(preset("tiny"));
  tiny["text_config"]["per_layer_config"] = json::object();
  result = parse_config(tiny);
  ASSERT_TRUE(result.ok()) << result.error().message;
  EXPECT_EQ(result.value().text.layer_head_dim(3), 16);
  EXPECT_EQ(result.value().text.layer_kv_heads(3), 2);
  EXPECT_EQ(result.value().text.num_global_key_value_heads, 0);
}

TEST(ConfigParse, RefusesPerLayerConfigItCannotRepresent) {
  const json base = to_json(preset("mid"));
  const auto with = [&](const char* per_layer) {
    json doc = base;
    doc["text_config"]["per_layer_config"] = json::parse(per_layer);
    return doc;
  };
  expect_invalid(with(R"({"5": {"head_dim": 256, "num_key_value_heads": 2},
                          "7": {"head_dim": 512, "num_key_value_heads": 2}})"),
                 {"text_config.per_layer_config.\"7\"", "full layer 5", "head_dim=512"});
  expect_invalid(with(R"({"5": {"head_dim": 256, "num_key_value_heads": 2}})"),
                 {"text_config.per_layer_config.\"7\"", "head_dim=128"});
  expect_invalid(with(R"({"0": {"head_dim": 256}})"),
                 {"text_config.per_layer_config.\"0\"", "sliding layer", "head_dim=256"});
  expect_invalid(with(R"({"5": {"sliding_window": 4}})"),
                 {"text_config.per_layer_config.\"5\".sliding_window", "not supported"});
  expect_invalid(with(R"({"x": {}})"),
                 {"text_config.per_layer_config.\"x\"", "layer index in [0, 8)"});
  expect_invalid(with(R"({"8": {}})"), {"text_config.per_layer_config.\"8\"", "got \"8\""});
  expect_invalid(with(R"({"5": {"head_dim": "256"}})"),
                 {"text_config.per_layer_config.\"5\".head_dim: expected an integer"});
  expect_invalid(with(R"([1])"), {"text_config.per_layer_config: expected an object"});
}

// ---- to_json -----------------------------------------------------------------------------

TEST(ConfigToJson, RoundTripsEveryPreset) {
  for (const auto& name : preset_names()) {
    SCOPED_TRACE(name);
    const ModelConfig original = preset(name);
    const auto reread = parse_config(to_json(original));
    ASSERT_TRUE(reread.ok()) << reread.error().message;
    expect_same_config(original, reread.value());
    // A second pass gives the same document.
    EXPECT_EQ(to_json(reread.value()), to_json(original));
  }
}

TEST(ConfigToJson, RoundTripsUnusualSettings) {
  ModelConfig c = preset("tiny");
  c.text.use_bidirectional_attention = "all";
  c.text.sliding_window = 9;
  c.text.num_global_key_value_heads = 0;
  c.text.rope_full = RopeParams{"proportional", 123456.0, 0.5, 4.0};
  c.text.rope_sliding = RopeParams{"default", 500.0, 1.0, 1.0};
  c.text.eos_token_ids = {1, 3};
  c.text.rms_norm_eps = 1.0 / 3.0;
  c.eos_token_ids = {7};
  c.dtype = "float32";
  ASSERT_NO_THROW(validate(c));
  const json doc = to_json(c);
  EXPECT_TRUE(doc["text_config"]["num_global_key_value_heads"].is_null());
  EXPECT_EQ(doc["text_config"]["use_bidirectional_attention"], "all");
  EXPECT_EQ(doc["eos_token_id"], 7);
  const auto reread = parse_config(doc);
  ASSERT_TRUE(reread.ok()) << reread.error().message;
  expect_same_config(c, reread.value());
}

TEST(ConfigToJson, WritesOnlyKeysTheReferenceAccepts) {
  const json doc = released_doc();
  const std::set<std::string> top{
      "model_type",   "architectures",  "canvas_length",       "eos_token_id", "boi_token_id",
      "eoi_token_id", "image_token_id", "tie_word_embeddings", "dtype",        "text_config"};
  const std::set<std::string> text{"model_type",
                                   "vocab_size",
                                   "hidden_size",
                                   "intermediate_size",
                                   "num_hidden_layers",
                                   "num_attention_heads",
                                   "num_key_value_heads",
                                   "num_global_key_value_heads",
                                   "head_dim",
                                   "global_head_dim",
                                   "hidden_activation",
                                   "max_position_embeddings",
                                   "initializer_range",
                                   "rms_norm_eps",
                                   "pad_token_id",
                                   "bos_token_id",
                                   "eos_token_id",
                                   "tie_word_embeddings",
                                   "attention_bias",
                                   "sliding_window",
                                   "layer_types",
                                   "final_logit_softcapping",
                                   "use_bidirectional_attention",
                                   "num_experts",
                                   "top_k_experts",
                                   "moe_intermediate_size",
                                   "rope_parameters"};
  std::set<std::string> top_seen;
  for (const auto& item : doc.items()) {
    top_seen.insert(item.key());
  }
  std::set<std::string> text_seen;
  for (const auto& item : doc["text_config"].items()) {
    text_seen.insert(item.key());
  }
  EXPECT_EQ(top_seen, top);
  EXPECT_EQ(text_seen, text);
  EXPECT_EQ(doc["model_type"], "diffusion_gemma");
  EXPECT_EQ(doc["architectures"], json::array({"DiffusionGemmaForBlockDiffusion"}));
  EXPECT_EQ(doc["text_config"]["model_type"], "diffusion_gemma_text");
  EXPECT_EQ(doc["text_config"]["layer_types"][5], "full_attention");
  EXPECT_EQ(doc["text_config"]["layer_types"][4], "sliding_attention");
  EXPECT_EQ(doc["eos_token_id"], json::array({1, 106}));
  // The released rope_parameters, with no spurious factor keys.
  EXPECT_EQ(doc["text_config"]["rope_parameters"],
            json::parse(R"({"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                            "full_attention": {"rope_type": "proportional",
                                               "partial_rotary_factor": 0.25,
                                               "rope_theta": 1000000.0}})"));
}

// ---- Validation --------------------------------------------------------------------------

TEST(ConfigValidate, TopKAboveExpertsNamesFieldExpectedAndActual) {
  json doc = released_doc();
  doc["text_config"]["top_k_experts"] = 200;
  const auto result = parse_config(doc);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().code, ErrorCode::InvalidArgument);
  EXPECT_EQ(result.error().message,
            "text_config.top_k_experts: expected an integer in [1, num_experts=128], got 200");
}

TEST(ConfigValidate, RejectsInconsistentValues) {
  struct Case {
    std::string what;
    std::function<void(json&)> edit;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"zero top_k",
       [](json& d) { d["text_config"]["top_k_experts"] = 0; },
       {"text_config.top_k_experts", "got 0"}},
      {"no experts",
       [](json& d) { d["text_config"].erase("num_experts"); },
       {"text_config.num_experts", "[1, 4096]", "got 0"}},
      {"too many experts",
       [](json& d) { d["text_config"]["num_experts"] = 5000; },
       {"text_config.num_experts", "sanity limit", "got 5000"}},
      {"no moe width",
       [](json& d) { d["text_config"]["moe_intermediate_size"] = 0; },
       {"text_config.moe_intermediate_size", "got 0"}},
      {"huge vocab",
       [](json& d) { d["text_config"]["vocab_size"] = 1 << 25; },
       {"text_config.vocab_size", "[1, 16777216] (sanity limit)", "got 33554432"}},
      {"huge hidden",
       [](json& d) { d["text_config"]["hidden_size"] = 100000; },
       {"text_config.hidden_size", "sanity limit", "got 100000"}},
      {"negative hidden",
       [](json& d) { d["text_config"]["hidden_size"] = -1; },
       {"text_config.hidden_size", "got -1"}},
      {"too many layers",
       [](json& d) {
         d["text_config"]["num_hidden_layers"] = 1000;
         d["text_config"].erase("layer_types");
       },
       {"text_config.num_hidden_layers", "[1, 512]", "got 1000"}},
      {"kv heads not a divisor",
       [](json& d) { d["text_config"]["num_key_value_heads"] = 3; },
       {"text_config.num_key_value_heads", "divisor of num_attention_heads=16", "got 3"}},
      {"kv heads above heads",
       [](json& d) { d["text_config"]["num_key_value_heads"] = 32; },
       {"text_config.num_key_value_heads", "num_attention_heads=16", "got 32"}},
      {"global kv heads",
       [](json& d) { d["text_config"]["num_global_key_value_heads"] = 5; },
       {"text_config.num_global_key_value_heads", "divisor", "got 5"}},
      {"odd head_dim",
       [](json& d) { d["text_config"]["head_dim"] = 255; },
       {"text_config.head_dim", "even", "got 255"}},
      {"odd global_head_dim",
       [](json& d) { d["text_config"]["global_head_dim"] = 511; },
       {"text_config.global_head_dim", "even", "got 511"}},
      {"layer_types length",
       [](json& d) { d["text_config"]["num_hidden_layers"] = 31; },
       {"text_config.layer_types", "num_hidden_layers=31", "got 30 entries"}},
      {"layer type name",
       [](json& d) { d["text_config"]["layer_types"][3] = "local"; },
       {"text_config.layer_types[3]", R"("sliding_attention" or "full_attention")",
        "got \"local\""}},
      {"pad id",
       [](json& d) { d["text_config"]["pad_token_id"] = 262144; },
       {"text_config.pad_token_id", "[0, vocab_size=262144)", "got 262144"}},
      {"negative pad",
       [](json& d) { d["text_config"]["pad_token_id"] = -1; },
       {"text_config.pad_token_id", "got -1"}},
      {"empty eos list",
       [](json& d) { d["text_config"]["eos_token_id"] = json::array(); },
       {"text_config.eos_token_id", "non-empty list", "got []"}},
      {"pad id in a smaller vocabulary",
       [](json& d) {
         d["text_config"]["vocab_size"] = 1000;
         d["text_config"]["pad_token_id"] = 1000;
       },
       {"text_config.pad_token_id", "[0, vocab_size=1000)", "got 1000"}},
      {"rms eps",
       [](json& d) { d["text_config"]["rms_norm_eps"] = 0.0; },
       {"text_config.rms_norm_eps", "> 0", "got 0.0"}},
      {"softcap",
       [](json& d) { d["text_config"]["final_logit_softcapping"] = -30.0; },
       {"text_config.final_logit_softcapping", "> 0", "got -30.0"}},
      {"canvas", [](json& d) { d["canvas_length"] = 0; }, {"canvas_length", "got 0"}},
      {"rope type",
       [](json& d) { d["text_config"]["rope_parameters"]["full_attention"]["rope_type"] = "yarn"; },
       {"text_config.rope_parameters.full_attention.rope_type", "\"proportional\"",
        "got \"yarn\""}},
      {"partial factor",
       [](json& d) {
         d["text_config"]["rope_parameters"]["full_attention"]["partial_rotary_factor"] = 1.5;
       },
       {"text_config.rope_parameters.full_attention.partial_rotary_factor", "(0, 1]", "got 1.5"}},
      {"zero partial factor",
       [](json& d) {
         d["text_config"]["rope_parameters"]["full_attention"]["partial_rotary_factor"] = 0;
       },
       {"partial_rotary_factor", "(0, 1]", "got 0.0"}},
      {"rope theta",
       [](json& d) { d["text_config"]["rope_parameters"]["sliding_attention"]["rope_theta"] = 0; },
       {"text_config.rope_parameters.sliding_attention.rope_theta", "got 0.0"}},
      {"missing rope entry",
       [](json& d) { d["text_config"]["rope_parameters"].erase("sliding_attention"); },
       {"text_config.rope_parameters.sliding_attention", "missing"}},
      {"activation",
       [](json& d) { d["text_config"]["hidden_activation"] = "silu"; },
       {"text_config.hidden_activation", "\"gelu_pytorch_tanh\"", "got \"silu\""}},
      {"untied",
       [](json& d) { d["text_config"]["tie_word_embeddings"] = false; },
       {"text_config.tie_word_embeddings", "got false"}},
      {"untied top level",
       [](json& d) { d["tie_word_embeddings"] = false; },
       {"tie_word_embeddings", "got false"}},
      {"bias",
       [](json& d) { d["text_config"]["attention_bias"] = true; },
       {"text_config.attention_bias", "got true"}},
      {"model type",
       [](json& d) { d["model_type"] = "gemma3"; },
       {"model_type", "\"diffusion_gemma\"", "got \"gemma3\""}},
      {"text model type",
       [](json& d) { d["text_config"]["model_type"] = "gemma3_text"; },
       {"text_config.model_type", "got \"gemma3_text\""}},
      {"bidirectional",
       [](json& d) { d["text_config"]["use_bidirectional_attention"] = "text"; },
       {"text_config.use_bidirectional_attention", R"("vision" or "all")", "got \"text\""}},
      {"window",
       [](json& d) { d["text_config"]["sliding_window"] = 0; },
       {"text_config.sliding_window", "got 0"}},
      {"window with all",
       [](json& d) {
         d["text_config"]["sliding_window"] = 0;
         d["text_config"]["use_bidirectional_attention"] = "all";
       },
       {"text_config.sliding_window", "got 0"}},
      {"dtype", [](json& d) { d["dtype"] = "int8"; }, {"dtype", "\"bfloat16\"", "got \"int8\""}},
      {"no text_config",
       [](json& d) { d.erase("text_config"); },
       {"text_config: expected an object", "missing"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    json doc = released_doc();
    c.edit(doc);
    expect_invalid(doc, c.parts);
  }
}

TEST(ConfigValidate, RejectsWrongJsonTypes) {
  struct Case {
    std::string what;
    std::function<void(json&)> edit;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"string for int",
       [](json& d) { d["text_config"]["hidden_size"] = "2816"; },
       {"text_config.hidden_size: expected an integer, got \"2816\""}},
      {"float for int",
       [](json& d) { d["text_config"]["head_dim"] = 256.5; },
       {"text_config.head_dim: expected an integer, got 256.5"}},
      {"bool for int",
       [](json& d) { d["text_config"]["num_experts"] = true; },
       {"text_config.num_experts: expected an integer, got true"}},
      {"null for int",
       [](json& d) { d["canvas_length"] = nullptr; },
       {"canvas_length: expected an integer, got null"}},
      {"beyond int64",
       [](json& d) { d["text_config"]["vocab_size"] = UINT64_MAX; },
       {"text_config.vocab_size: expected an integer below 2^63"}},
      {"string for float",
       [](json& d) { d["text_config"]["rms_norm_eps"] = "1e-6"; },
       {"text_config.rms_norm_eps: expected a number, got \"1e-6\""}},
      {"int for bool",
       [](json& d) { d["text_config"]["attention_bias"] = 0; },
       {"text_config.attention_bias: expected true or false, got 0"}},
      {"int for string", [](json& d) { d["dtype"] = 16; }, {"dtype: expected a string, got 16"}},
      {"string for layer list",
       [](json& d) { d["text_config"]["layer_types"] = "sliding"; },
       {"text_config.layer_types: expected a list"}},
      {"int in layer list",
       [](json& d) { d["text_config"]["layer_types"][0] = 0; },
       {"text_config.layer_types[0]", "got 0"}},
      {"list for rope",
       [](json& d) { d["text_config"]["rope_parameters"] = json::array(); },
       {"text_config.rope_parameters: expected an object"}},
      {"string for rope theta",
       [](json& d) { d["text_config"]["rope_parameters"]["full_attention"]["rope_theta"] = "1e6"; },
       {"text_config.rope_parameters.full_attention.rope_theta: expected a number"}},
      {"string eos",
       [](json& d) { d["eos_token_id"] = "1"; },
       {"eos_token_id: expected an integer or a non-empty list of integers, got \"1\""}},
      {"float in eos list",
       [](json& d) {
         d["text_config"]["eos_token_id"] = {1, 2.5};
       },
       {"text_config.eos_token_id[1]: expected an integer, got 2.5"}},
      {"bool for bidirectional",
       [](json& d) { d["text_config"]["use_bidirectional_attention"] = true; },
       {"text_config.use_bidirectional_attention", "got true"}},
      {"list for text_config",
       [](json& d) { d["text_config"] = json::array({1}); },
       {"text_config: expected an object, got [1]"}},
      {"nested list is described by its size",
       [](json& d) {
         d["text_config"] = json::array({json::array({1}), 2});
       },
       {"text_config: expected an object, got a list of 2 item(s)"}},
      {"long list is described by its size",
       [](json& d) { d["text_config"] = std::vector<int>(1000, 123456); },
       {"text_config: expected an object, got a list of 1000 item(s)"}},
      {"string for rope object",
       [](json& d) { d["text_config"]["rope_parameters"]["full_attention"] = "x"; },
       {"text_config.rope_parameters.full_attention: expected an object", "got \"x\""}},
      {"object for int",
       [](json& d) {
         d["canvas_length"] = {{"a", 1}, {"b", 2}};
       },
       {"canvas_length: expected an integer, got an object with 2 member(s)"}},
      {"long value is cut",
       [](json& d) { d["text_config"]["hidden_size"] = std::string(500, 'x'); },
       {"text_config.hidden_size: expected an integer, got \"xxx", "..."}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    json doc = released_doc();
    c.edit(doc);
    expect_invalid(doc, c.parts);
  }
  expect_invalid(json::array({1, 2}), {"config: expected a JSON object, got [1,2]"});
  expect_invalid(json("text"), {"config: expected a JSON object"});
}

TEST(ConfigValidate, ThrowsOnHandBuiltConfigs) {
  ModelConfig c = preset("tiny");
  c.text.layer_types.back() = LayerType::Sliding;  // the reference would silently change it
  try {
    validate(c);
    FAIL() << "validate accepted a last sliding layer";
  } catch (const base::ErrorException& e) {
    EXPECT_EQ(e.error().code, ErrorCode::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("text_config.layer_types[3]"), std::string::npos);
  }

  c = preset("tiny");
  c.text.use_bidirectional_attention = "all";
  c.text.sliding_window = 1;  // could not be written back as (1 - 1) * 2 = 0
  EXPECT_THROW(validate(c), base::ErrorException);

  c = preset("tiny");
  c.text.rope_sliding.factor = 0.0;
  EXPECT_THROW(validate(c), base::ErrorException);

  c = preset("tiny");
  // Invalid UTF-8 still makes a message, not a json::type_error.
  c.dtype = std::string("bf") + "\xff" + "16";
  EXPECT_THROW(validate(c), base::ErrorException);
}

// ---- Files -------------------------------------------------------------------------------

TEST_F(ConfigFileTest, LoadsFileAndNamesItAfterItsDirectory) {
  const auto path = write(to_json(preset("mid")).dump(2));
  const auto result = load_config_file(path);
  ASSERT_TRUE(result.ok()) << result.error().message;
  EXPECT_EQ(result.value().name, "my-checkpoint");
  expect_same_config(result.value(), preset("mid"));
}

TEST_F(ConfigFileTest, MissingFileIsFileNotFound) {
  const auto result = load_config_file(dir_ / "nope" / "config.json");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().code, ErrorCode::FileNotFound);
  EXPECT_NE(result.error().message.find("nope"), std::string::npos);
}

TEST_F(ConfigFileTest, TruncatedJsonIsFileCorrupted) {
  const std::string text = to_json(preset("tiny")).dump(2);
  const auto path = write(text.substr(0, text.size() / 2));
  const auto result = load_config_file(path);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().code, ErrorCode::FileCorrupted);
  EXPECT_NE(result.error().message.find(path.string()), std::string::npos);
  EXPECT_NE(result.error().message.find("not valid JSON (byte"), std::string::npos)
      << result.error().message;

  const auto empty = load_config_file(write(""));
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.error().code, ErrorCode::FileCorrupted);
}

TEST_F(ConfigFileTest, BadValueNamesFileAndField) {
  json doc = to_json(preset("tiny"));
  doc["text_config"]["top_k_experts"] = 9;
  const auto path = write(doc.dump());
  const auto result = load_config_file(path);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().code, ErrorCode::InvalidArgument);
  EXPECT_NE(result.error().message.find(path.string()), std::string::npos);
  EXPECT_NE(result.error().message.find(
                "text_config.top_k_experts: expected an integer in [1, num_experts=8], got 9"),
            std::string::npos);
}

// issue #14: a 200 KB config.json of nested arrays crashed with a stack overflow while the
// error message was being built (the message dumped the whole document).
TEST_F(ConfigFileTest, DeeplyNestedJsonIsRefusedWithoutRecursing) {
  const std::size_t depth = 100000;
  for (const std::string& text :
       {std::string(depth, '[') + std::string(depth, ']'),
        "{\"text_config\": " + std::string(depth, '[') + std::string(depth, ']') + "}",
        std::string(depth, '[')}) {  // truncated as well
    const auto path = write(text);
    const auto result = load_config_file(path);
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.error().code, ErrorCode::FileCorrupted);
    EXPECT_NE(result.error().message.find(path.string()), std::string::npos);
    EXPECT_NE(result.error().message.find("more than 64 deep"), std::string::npos)
        << result.error().message;
    EXPECT_EQ(result.error().message.find("[["), std::string::npos) << "echoes the input";
    EXPECT_LT(result.error().message.size(), 300U);
  }
  // Nesting up to the limit is parsed, and the message about it stays short.
  const auto path = write("{\"text_config\": " + std::string(60, '[') + std::string(60, ']') + "}");
  const auto result = load_config_file(path);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().code, ErrorCode::InvalidArgument);
  EXPECT_NE(result.error().message.find("text_config: expected an object, got a list of 1 item(s)"),
            std::string::npos)
      << result.error().message;
}

TEST(ConfigValidate, DeepDocumentsBuiltInMemoryGiveShortMessages) {
  // parse_config is also handed documents that were not read by parse_json.
  json deep = json::array();
  for (int i = 0; i < 100000; ++i) {
    json outer = json::array();
    outer.push_back(std::move(deep));
    deep = std::move(outer);
  }
  // (Moved, never copied: copying a json value recurses.)
  const auto top = parse_config(deep);
  ASSERT_FALSE(top.ok());
  EXPECT_EQ(top.error().message, "config: expected a JSON object, got a list of 1 item(s)");
  json doc = json::object();
  doc["text_config"] = std::move(deep);
  const auto inner = parse_config(doc);
  ASSERT_FALSE(inner.ok());
  EXPECT_EQ(inner.error().code, ErrorCode::InvalidArgument);
  EXPECT_EQ(inner.error().message, "text_config: expected an object, got a list of 1 item(s)");
}

TEST_F(ConfigFileTest, FifoIsRefusedWithoutBlocking) {
  const auto path = dir_ / "config.json";
  test::make_fifo(path);
  const base::Error error =
      test::expect_refused_without_blocking(path, [&]() -> base::Result<void> {
        auto r = load_config_file(path);
        if (!r.ok()) {
          return r.error();
        }
        return {};
      });
  EXPECT_EQ(error.code, ErrorCode::FileUnrecognised);
  EXPECT_NE(error.message.find("FIFO"), std::string::npos) << error.message;

  std::filesystem::remove(path);
  std::filesystem::create_directory(path);  // a directory named config.json
  const auto dir = load_config_file(path);
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.error().code, ErrorCode::FileUnrecognised);
}

// issue #14: transformers' save_pretrained for a smaller vocabulary keeps the released vision
// token ids (boi 255999, eoi 258882, image 258880), which then lie outside the text vocabulary.
// transformers loads such a config (it only warns); the text model never uses these ids.
TEST_F(ConfigFileTest, VisionTokenIdsOutsideTheVocabularyLoad) {
  json doc = to_json(preset("tiny"));
  doc["boi_token_id"] = 255999;
  doc["eoi_token_id"] = 258882;
  doc["image_token_id"] = 258880;
  ASSERT_LT(doc["text_config"]["vocab_size"].get<std::int64_t>(), 255999);
  const auto result = load_config_file(write(doc.dump(2)));
  ASSERT_TRUE(result.ok()) << result.error().message;
  EXPECT_EQ(result.value().boi_token_id, 255999);
  EXPECT_EQ(result.value().eoi_token_id, 258882);
  EXPECT_EQ(result.value().image_token_id, 258880);
  // Written back unchanged.
  const json back = to_json(result.value());
  EXPECT_EQ(back["boi_token_id"], 255999);
  EXPECT_EQ(back["image_token_id"], 258880);
}

TEST(ConfigParse, AcceptsWhatTransformersAcceptsForUnusedTokenIds) {
  json doc = to_json(preset("tiny"));
  // The reference types them `int | None`.
  doc["boi_token_id"] = nullptr;
  doc["eoi_token_id"] = -1;
  doc.erase("image_token_id");
  // bos / eos ids outside the vocabulary: transformers warns, BatchLens stops on
  // generation_config.json's eos ids, not these.
  doc["text_config"]["bos_token_id"] = -1;
  doc["text_config"]["eos_token_id"] = 999999;
  doc["eos_token_id"] = {1, 300000};
  const auto result = parse_config(doc);
  ASSERT_TRUE(result.ok()) << result.error().message;
  const ModelConfig& c = result.value();
  EXPECT_FALSE(c.boi_token_id.has_value());
  EXPECT_EQ(c.eoi_token_id, -1);
  EXPECT_EQ(c.image_token_id, 258880);  // the reference's default
  EXPECT_EQ(c.text.bos_token_id, -1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<std::int64_t>{1, 300000}));
  // null round-trips as null.
  const json back = to_json(c);
  EXPECT_TRUE(back["boi_token_id"].is_null());
  const auto again = parse_config(back);
  ASSERT_TRUE(again.ok()) << again.error().message;
  expect_same_config(again.value(), c);
  // Still integers: a string or a float is refused.
  doc["image_token_id"] = "258880";
  expect_invalid(doc, {"image_token_id: expected an integer, got \"258880\""});
}

}  // namespace
}  // namespace batchlens::model
