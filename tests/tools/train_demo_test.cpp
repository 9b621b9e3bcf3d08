// SPDX-License-Identifier: Apache-2.0
// The demo model's training script (tools/train_demo, issue #20) on this machine's CPU: the
// corpus and BPE tokenizer it prepares, its smoke training mode (a tiny config, a few steps,
// Debian's PyTorch; the plain-PyTorch port where transformers is not installed), resuming, and
// what it exports read by BatchLens: the tokenizer encodes exactly as the script's encoder and
// round-trips, and BatchLens's engine computes the script's logits from the exported weights.
// Skipped only where python3-torch or Debian's bible-kjv (the corpus) is missing.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/model/diffusion_gemma.h"
#include "core/model/loader.h"
#include "core/model/safetensors.h"
#include "core/setup/generate_api.h"
#include "core/text/tokenizer.h"
#include "tests/support/process.h"

#include <unistd.h>

namespace batchlens {
namespace {

namespace fs = std::filesystem;
using batchlens::testing::ProcessResult;
using batchlens::testing::run_process;

constexpr const char* kPython = "/usr/bin/python3";
fs::path train_script() {
  return fs::path(BL_SOURCE_DIR) / "tools" / "train_demo" / "train.py";
}

std::string missing_requirement() {
  if (!fs::exists("/usr/bin/bible")) {
    return "Debian's bible-kjv (the corpus) is not installed; scripts/install-deps.sh installs it";
  }
  if (run_process({kPython, "-c", "import torch"}).exit_code != 0) {
    return "python3-torch is not installed; scripts/install-deps.sh installs it";
  }
  return "";
}

ProcessResult script(std::vector<std::string> args, const fs::path& work) {
  std::vector<std::string> argv{kPython, train_script().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--work", work.string()});
  return run_process(argv);
}

std::vector<nlohmann::json> read_lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) {
      out.push_back(nlohmann::json::parse(line));
    }
  }
  return out;
}

fs::path fresh_work(const std::string& name) {
  fs::path p =
      fs::path(::testing::TempDir()) / ("bl_train_demo_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p;
}

// Removes a folder when the test ends, passed or not.
struct Cleanup {
  fs::path path;
  explicit Cleanup(fs::path p) : path(std::move(p)) {}
  Cleanup(const Cleanup&) = delete;
  Cleanup& operator=(const Cleanup&) = delete;
  Cleanup(Cleanup&&) = delete;
  Cleanup& operator=(Cleanup&&) = delete;
  ~Cleanup() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

#define BL_REQUIRE_TOOLS()                                             \
  do {                                                                 \
    if (const std::string why = missing_requirement(); !why.empty()) { \
      GTEST_SKIP() << why;                                             \
    }                                                                  \
  } while (false)

void expect_prepared(const fs::path& work, const ProcessResult& prepare) {
  EXPECT_NE(prepare.out.find("corpus: 31102 verses"), std::string::npos) << prepare.out;
  auto tok = text::Tokenizer::from_file(work / "tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  const text::Tokenizer& t = tok.value();
  EXPECT_EQ(t.vocab_size(), 4096);
  // Gemma's special tokens at Gemma's ids.
  EXPECT_EQ(t.token_id("<pad>"), 0);
  EXPECT_EQ(t.token_id("<eos>"), 1);
  EXPECT_EQ(t.token_id("<bos>"), 2);
  EXPECT_EQ(t.token_id("<|turn>"), 105);
  EXPECT_EQ(t.token_id("<turn|>"), 106);
  EXPECT_EQ(t.token_id("\n"), 107);
  EXPECT_TRUE(t.is_special(106));
  // Trained on the corpus: its common words are single pieces.
  for (const char* word : {"\xE2\x96\x81LORD", "\xE2\x96\x81unto", "\xE2\x96\x81thee"}) {
    EXPECT_TRUE(t.token_id(word).has_value()) << word;
  }
}

void expect_tokenizer_parity(const fs::path& exported) {
  auto tok = text::Tokenizer::from_file(exported / "tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  const auto lines = read_lines(exported / "parity" / "tokens.jsonl");
  ASSERT_GT(lines.size(), 300U);
  for (const auto& line : lines) {
    const std::string text = line.at("text").get<std::string>();
    const auto ids = tok.value().encode(text);
    ASSERT_TRUE(ids.ok()) << ids.error().message;
    EXPECT_EQ(ids.value(), line.at("ids").get<std::vector<std::int64_t>>()) << text;
    EXPECT_EQ(tok.value().decode(ids.value()), text);
  }
}

void expect_learning_log(const fs::path& log_path, const ProcessResult& train) {
  const auto log = read_lines(log_path);
  ASSERT_EQ(log.size(), 6U);
  int evals = 0;
  for (const auto& rec : log) {
    EXPECT_TRUE(std::isfinite(rec.at("loss").get<double>())) << rec.dump();
    if (rec.contains("held_out")) {
      ++evals;
      EXPECT_TRUE(std::isfinite(rec.at("held_out").get<double>()));
    }
  }
  EXPECT_EQ(evals, 2);
  // ln(4096) = 8.32 is where an untrained model starts.
  EXPECT_LT(log.back().at("held_out").get<double>(), 8.4);
  EXPECT_TRUE(train.out.find("(port)") != std::string::npos ||
              train.out.find("(transformers)") != std::string::npos)
      << train.out;
}

// BatchLens's engine (fp32) on the exported weights and the script's fixed inputs gives the
// script's logits, without and with self-conditioning.
void expect_logits_parity(const fs::path& exported, std::int64_t min_prompt = 17) {
  model::ModelSource source;
  source.checkpoint_dir = exported;
  model::LoadOptions options;
  options.dtype = "fp32";
  auto loaded = model::load_model(source, options);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  const model::DiffusionGemma& m = *loaded.value();
  const auto inputs = model::Checkpoint::open(exported / "parity" / "inputs_sc.safetensors");
  const auto expected = model::Checkpoint::open(exported / "parity" / "expected.safetensors");
  const at::Tensor prompt = inputs.tensor("input_ids");
  const at::Tensor canvas = inputs.tensor("decoder_input_ids");
  // The smoke config's sliding window (16) is shorter than the prompt: the window's mask and
  // the cache the decoder reads are both exercised.
  ASSERT_GE(prompt.size(1), min_prompt);
  model::KvCache cache;
  m.encode(prompt, cache);
  const at::Tensor plain = m.decode(canvas, cache, at::Tensor());
  const at::Tensor sc = m.decode(canvas, cache, inputs.tensor("self_conditioning_logits"));
  for (const auto& [got, name] :
       {std::pair{plain, "logits"}, std::pair{sc, "logits_self_conditioned"}}) {
    const at::Tensor want = expected.tensor(name);
    ASSERT_EQ(got.sizes(), want.sizes()) << name;
    const auto diff = (got - want).abs().max().item<double>();
    // Same math in the same dtype; bitwise on the machines tried, a float's rounding allowed.
    EXPECT_LT(diff, 1e-4) << name << ": max |BatchLens - script| = " << diff;
    EXPECT_GT(want.abs().max().item<double>(), 0.1) << name;
  }
}

// The bundled trained model (resources/models/demo-trained, the GUI's default demo): its
// tokenizer gives the training script's ids, BatchLens's engine gives the training port's
// logits on its weights, and the embedded preset (what the GUI and CLI run) generates a text
// that ends with EOS for a fixed seed on this CPU. Needs no Python.
TEST(TrainDemo, TheBundledModelMatchesItsTrainingPortAndStops) {
  const fs::path bundled = fs::path(BL_SOURCE_DIR) / "resources" / "models" / "demo-trained";
  expect_tokenizer_parity(bundled);
  expect_logits_parity(bundled, 8);
  model::ModelSource preset;
  preset.preset = "demo-trained";
  setup::GenerateRequest request;
  // Sampling seed 1 on this prompt stops (at 19) with oneDNN's, AVX2 ATen's and default ATen's
  // bf16 matmuls alike (ONEDNN_MAX_CPU_ISA / ATEN_CPU_CAPABILITY tried on an AVX-512 CPU): the
  // text's bits depend on the CPU's kernels, its stopping here did not.
  request.prompt.text = "The LORD is my shepherd; I shall not want.";
  request.seed = 1;
  auto report = setup::run_generation(preset, model::LoadOptions{}, request);
  ASSERT_TRUE(report.ok()) << report.error().message;
  ASSERT_EQ(report.value().rows.size(), 1U);
  const auto& row = report.value().rows[0];
  EXPECT_GE(row.stop_position, 0) << row.text;
  EXPECT_LE(row.stop_position, 64) << row.text;
  // Words of the corpus, not random pieces.
  EXPECT_NE(row.text.find("the"), std::string::npos) << row.text;
  EXPECT_NE(row.text.find("LORD"), std::string::npos) << row.text;
}

TEST(TrainDemo, SmokeRunPreparesTrainsAndExportsWhatBatchLensReads) {
  BL_REQUIRE_TOOLS();
  const Cleanup work(fresh_work("smoke"));
  const ProcessResult prepare = script({"prepare"}, work.path);
  ASSERT_EQ(prepare.exit_code, 0) << prepare.out << prepare.err;
  expect_prepared(work.path, prepare);
  const ProcessResult train = script({"train", "--smoke", "--device", "cpu"}, work.path);
  ASSERT_EQ(train.exit_code, 0) << train.out << train.err;
  expect_learning_log(work.path / "log-smoke.jsonl", train);
  const ProcessResult exported = script({"export", "--smoke"}, work.path);
  ASSERT_EQ(exported.exit_code, 0) << exported.out << exported.err;
  const fs::path out = work.path / "demo-trained";
  for (const char* f :
       {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"}) {
    EXPECT_TRUE(fs::is_regular_file(out / f)) << f;
  }
  expect_tokenizer_parity(out);
  expect_logits_parity(out);
}

// Both ways of training: the reference steps, and --fast's (dense experts, fixed-shape
// left-padded batches drawn on the device, the masked mean; CUDA graphs only on a GPU).
TEST(TrainDemo, ResumedRunEqualsAnUninterruptedOne) {
  BL_REQUIRE_TOOLS();
  const Cleanup whole(fresh_work("whole"));
  const ProcessResult prepare = script({"prepare"}, whole.path);
  ASSERT_EQ(prepare.exit_code, 0) << prepare.out << prepare.err;
  const Cleanup parts(fresh_work("parts"));
  fs::create_directories(parts.path);
  for (const char* flag : {"", "--fast"}) {
    const std::string mode = flag;
    SCOPED_TRACE(mode.empty() ? "reference steps" : mode);
    fs::remove_all(parts.path);
    fs::create_directories(parts.path);
    fs::copy_file(whole.path / "kjv.jsonl", parts.path / "kjv.jsonl");
    fs::copy_file(whole.path / "tokenizer.json", parts.path / "tokenizer.json");
    std::vector<std::string> train{"train", "--smoke", "--device", "cpu"};
    if (!mode.empty()) {
      train.push_back(mode);
    }
    auto with = [&train](std::vector<std::string> more) {
      std::vector<std::string> args = train;
      args.insert(args.end(), more.begin(), more.end());
      return args;
    };
    const auto once = script(with({"--fresh"}), whole.path);
    ASSERT_EQ(once.exit_code, 0) << once.out << once.err;
    const auto first = script(with({"--stop-at", "3"}), parts.path);
    ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
    EXPECT_NE(first.out.find("stopped at step 3 of 6"), std::string::npos) << first.out;
    const auto second = script(train, parts.path);
    ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
    EXPECT_NE(second.out.find("resumed at step 3"), std::string::npos) << second.out;
    const auto a = read_lines(whole.path / "log-smoke.jsonl");
    const auto b = read_lines(parts.path / "log-smoke.jsonl");
    ASSERT_EQ(b.size(), a.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(b[i].at("loss"), a[i].at("loss")) << "step " << i + 1;
      EXPECT_EQ(b[i].value("held_out", -1.0), a[i].value("held_out", -1.0)) << "step " << i + 1;
    }
  }
}

}  // namespace
}  // namespace batchlens
