// SPDX-License-Identifier: Apache-2.0
#include "core/model/weights.h"

#include <filesystem>
#include <set>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "core/base/error.h"
#include "core/model/safetensors.h"

namespace batchlens::model {
namespace {

namespace fs = std::filesystem;

ModelConfig weights_preset(const std::string& name) {
  auto c = load_preset(name);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return c.value();
}

class TempDir {
 public:
  TempDir()
      : path_(fs::temp_directory_path() /
              ("bl_weights_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  TempDir(TempDir&&) = delete;
  TempDir& operator=(TempDir&&) = delete;
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

TEST(WeightSpecs, ReleasedArchitectureHas25Point25BillionTextParameters) {
  const ModelConfig c = weights_preset("26b-a4b");
  std::int64_t total = 0;
  std::set<std::string> keys;
  for (const auto& s : weight_specs(c.text)) {
    std::int64_t n = 1;
    for (auto d : s.shape) {
      n *= d;
    }
    total += n;
    EXPECT_TRUE(keys.insert(s.key).second) << s.key;
  }
  // Spec section 1.4: 25.25 B text parameters.
  EXPECT_GT(total, 25'200'000'000LL);
  EXPECT_LT(total, 25'300'000'000LL);
  EXPECT_EQ(keys.count("model.decoder.layers.4.self_attn.v_proj.weight"), 1U);
  EXPECT_EQ(keys.count("model.decoder.layers.5.self_attn.v_proj.weight"), 0U);  // full: k_eq_v
  EXPECT_EQ(keys.count("model.encoder.language_model.layers.29.layer_scalar"), 1U);
  EXPECT_EQ(keys.count("lm_head.weight"), 0U);  // tied to the embedding
  for (const auto& s : weight_specs(c.text)) {
    if (s.key == "model.decoder.layers.0.experts.gate_up_proj") {
      EXPECT_EQ(s.shape, (std::vector<std::int64_t>{128, 1408, 2816}));
    }
    if (s.key == "model.decoder.layers.5.self_attn.o_proj.weight") {
      EXPECT_EQ(s.shape, (std::vector<std::int64_t>{2816, 8192}));
    }
    if (s.key == "model.decoder.layers.5.self_attn.k_proj.weight") {
      EXPECT_EQ(s.shape, (std::vector<std::int64_t>{1024, 2816}));
    }
  }
}

TEST(RandomWeights, SeededDeterministicAndFollowingTheReferenceInit) {
  const ModelConfig c = weights_preset("tiny");
  const ModelWeights a = random_weights(c, 3, at::kCPU, at::kBFloat16);
  const ModelWeights b = random_weights(c, 3, at::kCPU, at::kBFloat16);
  const ModelWeights d = random_weights(c, 4, at::kCPU, at::kBFloat16);
  const auto na = named_tensors(a, c.text);
  const auto nb = named_tensors(b, c.text);
  ASSERT_EQ(na.size(), nb.size());
  for (std::size_t i = 0; i < na.size(); ++i) {
    EXPECT_TRUE(at::equal(na[i].second, nb[i].second)) << na[i].first;
    EXPECT_EQ(na[i].second.scalar_type(), at::kBFloat16);
  }
  EXPECT_FALSE(at::equal(a.embed, d.embed));
  EXPECT_EQ(a.embed[c.text.pad_token_id].abs().sum().item<float>(), 0.0F);  // pad row
  EXPECT_TRUE(at::equal(a.layers[0].input_layernorm, at::ones_like(a.layers[0].input_layernorm)));
  EXPECT_TRUE(at::equal(a.layers[1].router_per_expert_scale,
                        at::ones_like(a.layers[1].router_per_expert_scale)));
  const double std = a.layers[0].experts_gate_up.to(at::kFloat).std().item<double>();
  EXPECT_NEAR(std, c.text.initializer_range, 0.1 * c.text.initializer_range);
  EXPECT_FALSE(a.layers.back().v_proj.defined());
  EXPECT_TRUE(a.layers.front().v_proj.defined());
}

TEST(LoadWeights, RoundTripsThroughAShardedCheckpoint) {
  const ModelConfig c = weights_preset("tiny");
  const ModelWeights w = random_weights(c, 5, at::kCPU, at::kBFloat16);
  TempDir dir;
  write_checkpoint(dir.path(), named_tensors(w, c.text), 64 * 1024);
  ASSERT_TRUE(fs::exists(dir.path() / "model.safetensors.index.json"));
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  int calls = 0;
  const ModelWeights back =
      load_weights(ckpt, c, at::kCPU, at::kBFloat16, [&calls](const base::Progress&) { ++calls; });
  EXPECT_EQ(calls, static_cast<int>(weight_specs(c.text).size()));
  const auto a = named_tensors(w, c.text);
  const auto b = named_tensors(back, c.text);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first;
  }
  // Loading as fp32 converts.
  const ModelWeights f32 = load_weights(ckpt, c, at::kCPU, at::kFloat);
  EXPECT_EQ(f32.dtype(), at::kFloat);
  EXPECT_TRUE(at::equal(f32.embed, w.embed.to(at::kFloat)));
}

TEST(LoadWeights, NamesMissingUnexpectedAndMisshapenKeys) {
  const ModelConfig c = weights_preset("tiny");
  const ModelWeights w = random_weights(c, 6, at::kCPU, at::kBFloat16);
  auto tensors = named_tensors(w, c.text);
  TempDir dir;

  auto missing = tensors;
  missing.erase(missing.begin() + 3);
  write_safetensors(dir.path() / "missing.safetensors", missing);
  const auto r1 = base::guarded([&] {
    return load_weights(Checkpoint::open(dir.path() / "missing.safetensors"), c, at::kCPU,
                        at::kBFloat16);
  });
  ASSERT_FALSE(r1.ok());
  EXPECT_EQ(r1.error().code, base::ErrorCode::FileCorrupted);
  EXPECT_NE(r1.error().message.find("1 missing: " + tensors[3].first), std::string::npos)
      << r1.error().message;

  auto extra = tensors;
  extra.emplace_back("model.decoder.layers.0.mlp.bias", at::zeros({4}));
  extra.emplace_back("model.encoder.vision_tower.patch_embedder.input_proj.weight",
                     at::zeros({2, 2}));  // ignored: BatchLens is text-only
  write_safetensors(dir.path() / "extra.safetensors", extra);
  const auto r2 = base::guarded([&] {
    return load_weights(Checkpoint::open(dir.path() / "extra.safetensors"), c, at::kCPU,
                        at::kBFloat16);
  });
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.error().message.find("1 unexpected: model.decoder.layers.0.mlp.bias"),
            std::string::npos)
      << r2.error().message;

  auto wrong = tensors;
  wrong[0].second = at::zeros({2, 2}, at::kBFloat16);
  write_safetensors(dir.path() / "wrong.safetensors", wrong);
  const auto r3 = base::guarded([&] {
    return load_weights(Checkpoint::open(dir.path() / "wrong.safetensors"), c, at::kCPU,
                        at::kBFloat16);
  });
  ASSERT_FALSE(r3.ok());
  EXPECT_NE(r3.error().message.find(tensors[0].first + ": expected ["), std::string::npos)
      << r3.error().message;
  EXPECT_NE(r3.error().message.find("got [2, 2]"), std::string::npos) << r3.error().message;
}

TEST(LoadWeights, CancelStopsLoading) {
  const ModelConfig c = weights_preset("tiny");
  TempDir dir;
  write_safetensors(dir.path() / "m.safetensors",
                    named_tensors(random_weights(c, 1, at::kCPU, at::kBFloat16), c.text));
  base::CancelToken cancel;
  cancel.cancel();
  const auto r = base::guarded([&] {
    return load_weights(Checkpoint::open(dir.path() / "m.safetensors"), c, at::kCPU, at::kBFloat16,
                        {}, &cancel);
  });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, base::ErrorCode::Cancelled);
}

}  // namespace
}  // namespace batchlens::model
