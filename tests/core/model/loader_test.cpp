// SPDX-License-Identifier: Apache-2.0
// load_model's memory check before loading and save_random_model's all-or-nothing folder
// (issue #14).
#include "core/model/loader.h"

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "core/base/cancel.h"
#include "core/base/error.h"
#include "core/model/config.h"
#include "core/model/diffusion_gemma.h"
#include "core/model/weights.h"
#include "core/setup/front_door.h"
#include "core/setup/random_model.h"

#include <sys/stat.h>
#include <unistd.h>

namespace batchlens::model {
namespace {

namespace fs = std::filesystem;
using base::ErrorCode;

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

ModelConfig loader_preset(const std::string& name) {
  auto c = load_preset(name);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return c.value();
}

std::uint64_t parameter_count(const ModelConfig& config) {
  std::uint64_t total = 0;
  for (const auto& spec : weight_specs(config.text)) {
    std::uint64_t n = 1;
    for (const auto d : spec.shape) {
      n *= static_cast<std::uint64_t>(d);
    }
    total += n;
  }
  return total;
}

/// A free-memory source that reports `bytes`, as a machine with that much free would.
FreeMemoryFn fake_free(std::uint64_t bytes) {
  return [bytes](const std::string&) {
    return std::optional<FreeMemory>(FreeMemory{bytes, "fake"});
  };
}

// ---- Estimate ------------------------------------------------------------------------------

TEST(MemoryEstimate, WeightsAreTheParametersInTheRunDtype) {
  for (const auto& name : preset_names()) {
    SCOPED_TRACE(name);
    const ModelConfig c = loader_preset(name);
    const MemoryEstimate bf16 = estimate_memory(c, "bf16");
    const MemoryEstimate fp32 = estimate_memory(c, "fp32");
    EXPECT_EQ(bf16.weights, parameter_count(c) * 2);
    EXPECT_EQ(fp32.weights, parameter_count(c) * 4);
    EXPECT_GT(bf16.total(), bf16.weights);
    EXPECT_GT(bf16.kv_cache, 0U);
    EXPECT_GT(bf16.logits, 0U);
    EXPECT_GT(bf16.activations, 0U);
  }
  // The weights the loader builds for a small preset are exactly what the estimate says.
  const ModelConfig demo = loader_preset("demo");
  EXPECT_EQ(static_cast<std::uint64_t>(random_weights(demo, 0, at::kCPU, at::kBFloat16).bytes()),
            estimate_memory(demo, "bf16").weights);
}

TEST(MemoryEstimate, ReleasedModelIsWithinSaneBounds) {
  // DiffusionGemma 26B-A4B: about 25-26 billion parameters, ~48 GiB in bf16.
  const ModelConfig c = loader_preset("26b-a4b");
  const MemoryEstimate m = estimate_memory(c, "bf16");
  EXPECT_GT(m.weights, 45 * kGiB);
  EXPECT_LT(m.weights, 55 * kGiB);
  // One row of one canvas: the working set is a small share on top of the weights.
  EXPECT_GT(m.total(), m.weights + kGiB);
  EXPECT_LT(m.total(), m.weights + 8 * kGiB) << m.describe();
  // Logits [1, 256, 262144]: 256 MiB each in fp32; a step keeps a handful.
  EXPECT_GT(m.logits, std::uint64_t{1} << 30);
  EXPECT_LT(m.logits, std::uint64_t{4} << 30);

  // More rows and longer sequences cost more, in proportion where the cost is per row.
  Workload big;
  big.rows = 10;  // ref + repeat + B=2,3,4
  big.max_batch = 4;
  big.prompt_tokens = 1000;
  big.new_tokens = 1024;
  const MemoryEstimate b = estimate_memory(c, "bf16", big);
  EXPECT_EQ(b.weights, m.weights);
  EXPECT_GT(b.kv_cache, 10 * m.kv_cache);
  EXPECT_GT(b.logits, 4 * m.logits);
  EXPECT_LT(b.total(), m.weights + 40 * kGiB) << b.describe();
  EXPECT_EQ(b.sequence, 1000 + 1024);
  EXPECT_NE(b.describe().find("10 row(s) x 2024 tokens"), std::string::npos) << b.describe();
}

TEST(MemoryEstimate, HostFreeMemoryIsReadOnLinux) {
  const auto free = query_free_memory("cpu");
  ASSERT_TRUE(free.has_value());
  EXPECT_GT(free->bytes, 16U << 20);
  EXPECT_FALSE(free->source.empty());
  EXPECT_FALSE(query_free_memory("tpu").has_value());
}

TEST(MemoryEstimate, CheckComparesWithTheFreeMemory) {
  const MemoryEstimate m = estimate_memory(loader_preset("tiny"), "bf16");
  EXPECT_TRUE(check_memory(m, "tiny", "cpu", fake_free(m.total())).ok());
  const auto refused = check_memory(m, "tiny", "cpu", fake_free(m.total() - 1));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::OutOfMemory);
  // Unknown free memory refuses nothing.
  EXPECT_TRUE(check_memory(m, "tiny", "cpu", [](const std::string&) {
                return std::optional<FreeMemory>();
              }).ok());
}

// ---- load_model ----------------------------------------------------------------------------

// issue #14: `--preset 26b-a4b` on a CPU was killed by the OOM killer halfway through building
// the weights; now it is refused before anything large is allocated.
TEST(LoadModel, ReleasedPresetOnASmallMachineIsRefusedUpFront) {
  LoadOptions options;
  options.free_memory = fake_free(16 * kGiB);
  const auto start = std::chrono::steady_clock::now();
  const auto model = load_model(ModelSource{"26b-a4b", {}, 0}, options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.error().code, ErrorCode::OutOfMemory);
  const std::string& message = model.error().message;
  EXPECT_NE(message.find("26b-a4b"), std::string::npos) << message;
  EXPECT_NE(message.find("on cpu"), std::string::npos) << message;
  EXPECT_NE(message.find("weights"), std::string::npos) << message;
  EXPECT_NE(message.find("16.0 GiB is free (fake)"), std::string::npos) << message;
  EXPECT_LT(seconds, 5.0) << "refused only after allocating";
}

TEST(LoadModel, FitsWhenTheFreeMemoryIsEnoughAndTheWorkloadCounts) {
  const MemoryEstimate one = estimate_memory(loader_preset("tiny"), "bf16");
  LoadOptions options;
  options.free_memory = fake_free(one.total());
  ASSERT_TRUE(load_model(ModelSource{"tiny", {}, 0}, options).ok());
  // The same free memory is too little for a larger workload.
  options.workload.rows = 64;
  options.workload.max_batch = 32;
  const auto refused = load_model(ModelSource{"tiny", {}, 0}, options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::OutOfMemory);
  EXPECT_NE(refused.error().message.find("64 row(s)"), std::string::npos)
      << refused.error().message;
  // fp32 weights are twice the size.
  LoadOptions fp32;
  fp32.dtype = "fp32";
  fp32.free_memory = fake_free(one.total());
  EXPECT_EQ(load_model(ModelSource{"tiny", {}, 0}, fp32).error().code, ErrorCode::OutOfMemory);
}

class SaveModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() /
            ("bl_loader_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override {
    ::chmod(root_.c_str(), 0755);
    fs::remove_all(root_);
  }
  /// Entries directly in `dir` (temporaries of a failed save would show here).
  static int entries(const fs::path& dir) {
    int n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) {
      ++n;
    }
    return n;
  }
  fs::path root_;
};

TEST_F(SaveModelTest, WritesACompleteCheckpointThatLoads) {
  const fs::path dir = root_ / "new" / "ckpt";  // parents are made
  ASSERT_TRUE(setup::save_random_model("tiny", 3, dir).ok());
  for (const char* f :
       {"config.json", "tokenizer.json", "generation_config.json", "model.safetensors"}) {
    EXPECT_TRUE(fs::is_regular_file(dir / f)) << f;
  }
  EXPECT_EQ(entries(dir.parent_path()), 1);  // no temporaries beside it
  LoadOptions options;
  const auto model = load_model(ModelSource{{}, dir, 0}, options);
  ASSERT_TRUE(model.ok()) << model.error().message;
  // The memory check covers checkpoints too, before their weights are opened.
  options.free_memory = fake_free(1 << 20);
  fs::remove(dir / "model.safetensors");
  EXPECT_EQ(load_model(ModelSource{{}, dir, 0}, options).error().code, ErrorCode::OutOfMemory);
}

// issue #14: a failure midway left a half-written checkpoint folder behind.
TEST_F(SaveModelTest, AFailureMidwayLeavesNothing) {
  for (const int after : {0, 1, 3}) {
    SCOPED_TRACE(after);
    const fs::path dir = root_ / "made" / "for" / "ckpt";
    const auto saved = setup::save_random_model("tiny", 3, dir, 4ULL << 30, after);
    ASSERT_FALSE(saved.ok());
    EXPECT_NE(saved.error().message.find("injected"), std::string::npos) << saved.error().message;
    EXPECT_FALSE(fs::exists(dir));
    EXPECT_FALSE(fs::exists(root_ / "made")) << "parent folders it made are removed";
    EXPECT_EQ(entries(root_), 0);
  }
  // Sharded: a failure after the shards and the index were written.
  const fs::path dir = root_ / "sharded";
  ASSERT_FALSE(setup::save_random_model("tiny", 3, dir, 1 << 16, 0).ok());
  EXPECT_EQ(entries(root_), 0);
}

// issue #37: open_session makes the prompt's ids on a thread of its own while the model loads.
TEST_F(SaveModelTest, ASessionMakesThePromptBesideTheLoad) {
  const fs::path dir = root_ / "ckpt";
  ASSERT_TRUE(setup::save_random_model("tiny", 3, dir).ok());
  const ModelSource source{{}, dir, 0};
  setup::Prompt prompt;
  prompt.text = "Hello there";
  auto session = setup::open_session(source, LoadOptions{}, prompt, {});
  ASSERT_TRUE(session.ok()) << session.error().message;
  const auto alone = setup::prepare(source, prompt, {});
  ASSERT_TRUE(alone.ok()) << alone.error().message;
  EXPECT_EQ(session.value().inputs.prompt_ids, alone.value().prompt_ids);
  EXPECT_NE(session.value().model, nullptr);
  EXPECT_NE(session.value().tokenizer, nullptr);
  EXPECT_EQ(session.value().load.cancel, nullptr) << "no token of the call is kept";

  // A prompt that cannot be read stops the load, and its error is the one reported (not the
  // load's "cancelled").
  fs::remove(dir / "tokenizer.json");
  session = setup::open_session(source, LoadOptions{}, prompt, {});
  ASSERT_FALSE(session.ok());
  EXPECT_EQ(session.error().code, ErrorCode::FileNotFound) << session.error().message;
  EXPECT_NE(session.error().message.find("tokenizer.json"), std::string::npos);

  // The caller's cancel still reaches the load.
  base::CancelToken cancel;
  cancel.cancel();
  LoadOptions cancelled;
  cancelled.cancel = &cancel;
  prompt.ids = {2, 5, 7};
  session = setup::open_session(source, cancelled, prompt, {});
  ASSERT_FALSE(session.ok());
  EXPECT_EQ(session.error().code, ErrorCode::Cancelled) << session.error().message;
}

TEST(CancelToken, AChildSeesItsParentButNotTheOtherWay) {
  base::CancelToken parent;
  base::CancelToken child(&parent);
  EXPECT_FALSE(child.cancelled());
  child.cancel();
  EXPECT_TRUE(child.cancelled());
  EXPECT_FALSE(parent.cancelled());
  child.reset();
  parent.cancel();
  EXPECT_TRUE(child.cancelled());
  child.reset();  // its own flag only
  EXPECT_TRUE(child.cancelled());
}

TEST_F(SaveModelTest, ReadOnlyParentLeavesNothing) {
  if (::geteuid() == 0) {
    GTEST_SKIP() << "root ignores the read-only permission this test relies on";
  }
  const fs::path parent = root_ / "readonly";
  fs::create_directories(parent);
  ::chmod(parent.c_str(), 0555);
  const auto saved = setup::save_random_model("tiny", 3, parent / "ckpt");
  ::chmod(parent.c_str(), 0755);
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.error().code, ErrorCode::IoFailed) << saved.error().message;
  EXPECT_EQ(entries(parent), 0);
}

TEST_F(SaveModelTest, RefusesAFolderThatHoldsFiles) {
  const fs::path dir = root_ / "busy";
  fs::create_directories(dir);
  { std::ofstream(dir / "keep.txt") << "mine"; }
  const auto saved = setup::save_random_model("tiny", 3, dir);
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.error().code, ErrorCode::InvalidArgument);
  EXPECT_EQ(entries(dir), 1);
  EXPECT_EQ(entries(root_), 1);
  // An empty folder is filled.
  const fs::path empty = root_ / "empty";
  fs::create_directories(empty);
  ASSERT_TRUE(setup::save_random_model("tiny", 3, empty).ok());
  EXPECT_TRUE(fs::is_regular_file(empty / "config.json"));
}

}  // namespace
}  // namespace batchlens::model
