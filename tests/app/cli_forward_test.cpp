// SPDX-License-Identifier: Apache-2.0
// `batchlens-cli save-model` + `forward` end to end on the tiny preset.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/model/diffusion_gemma.h"
#include "core/model/loader.h"
#include "core/model/safetensors.h"
#include "tests/support/process.h"

namespace batchlens {
namespace {

namespace fs = std::filesystem;
using testing::run_process;

TEST(CliForward, SavedCheckpointAndForwardMatchTheInProcessModel) {
  const fs::path dir = fs::temp_directory_path() / ("bl_cli_forward_" + std::to_string(getpid()));
  fs::remove_all(dir);
  const auto saved = run_process({BL_CLI_PATH, "save-model", "--preset", "tiny", "--seed", "4",
                                  "--out", (dir / "ckpt").string()});
  ASSERT_EQ(saved.exit_code, 0) << saved.err;
  ASSERT_TRUE(fs::exists(dir / "ckpt" / "config.json"));

  const auto model = model::load_model(model::ModelSource{"tiny", {}, 4}, model::LoadOptions{});
  ASSERT_TRUE(model.ok()) << model.error().message;
  const auto& m = *model.value();
  const std::int64_t c = m.config().canvas_length;
  const at::Tensor prompt = at::arange(3, 9, at::kLong).view({1, 6});
  const at::Tensor canvas = at::arange(10, 10 + c, at::kLong).view({1, c});
  model::write_safetensors(dir / "in.safetensors",
                           {{"input_ids", prompt}, {"decoder_input_ids", canvas}});

  const auto fwd =
      run_process({BL_CLI_PATH, "forward", "--checkpoint", (dir / "ckpt").string(), "--inputs",
                   (dir / "in.safetensors").string(), "--out", (dir / "out.safetensors").string(),
                   "--taps", "router.scores,logits", "--rows", "2", "--repeat", "2"});
  ASSERT_EQ(fwd.exit_code, 0) << fwd.err;
  EXPECT_NE(fwd.out.find("batch 2"), std::string::npos) << fwd.out;
  EXPECT_NE(fwd.out.find("median"), std::string::npos) << fwd.out;

  const auto out = model::SafetensorsFile::open(dir / "out.safetensors");
  const at::Tensor logits = out->tensor("logits");
  ASSERT_EQ(logits.sizes(), (at::IntArrayRef{2, c, m.config().text.vocab_size}));
  EXPECT_EQ(out->tensors().count("router.scores.0"), 1U);
  EXPECT_EQ(out->tensors().count("attn.q.0"), 0U);

  model::KvCache cache;
  m.encode(prompt, cache);
  const at::Tensor expected = m.decode(canvas, cache, at::Tensor());
  EXPECT_TRUE(at::equal(logits[0], expected[0]));
  EXPECT_TRUE(at::equal(logits[1], expected[0]));

  // Bad inputs: a clear message and exit 1, no output file.
  model::write_safetensors(dir / "bad.safetensors", {{"input_ids", prompt}});
  const auto bad = run_process({BL_CLI_PATH, "forward", "--preset", "tiny", "--inputs",
                                (dir / "bad.safetensors").string(), "--out",
                                (dir / "bad_out.safetensors").string()});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("decoder_input_ids"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(dir / "bad_out.safetensors"));
  const auto dev =
      run_process({BL_CLI_PATH, "forward", "--preset", "tiny", "--device", "cuda:7", "--inputs",
                   (dir / "in.safetensors").string(), "--out", (dir / "x.safetensors").string()});
  EXPECT_EQ(dev.exit_code, 1);
  EXPECT_NE(dev.err.find("DeviceUnavailable"), std::string::npos) << dev.err;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace batchlens

namespace batchlens {
namespace {

TEST(CliGenerate, PrintsEveryRowAndIsReproducible) {
  const std::vector<std::string> args{
      BL_CLI_PATH, "generate", "--preset", "tiny", "--prompt-ids",     "2,105,50,60,70",
      "--batch",   "2",        "--steps",  "4",    "--max-new-tokens", "16"};
  const auto a = testing::run_process(args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_NE(a.out.find("row 0: steps"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("row 1: steps"), std::string::npos) << a.out;
  EXPECT_NE(a.err.find("canvas 1 step"), std::string::npos) << a.err;  // progress on stderr
  EXPECT_EQ(testing::run_process(args).out, a.out);
  const auto bad =
      testing::run_process({BL_CLI_PATH, "generate", "--preset", "tiny", "--prompt-ids", "2,x"});
  EXPECT_EQ(bad.exit_code, 2);
  const auto rng = testing::run_process(
      {BL_CLI_PATH, "generate", "--preset", "tiny", "--prompt-ids", "2", "--rng", "global"});
  EXPECT_EQ(rng.exit_code, 2);  // a bad command line, refused before any work
  EXPECT_NE(rng.err.find("per_row or shared"), std::string::npos) << rng.err;
}

TEST(CliGenerate, CtrlCCancelsWithExitCode130) {
  // A long demo generation interrupted by SIGINT once its progress shows (a fixed delay raced
  // the program's start on a busy machine: the signal came before its handler).
  const fs::path logs = fs::temp_directory_path() / ("bl_gen_int_" + std::to_string(getpid()));
  fs::create_directories(logs);
  testing::Child child({BL_CLI_PATH, "generate", "--preset", "demo", "--prompt-ids", "2,105,50",
                        "--batch", "4", "--steps", "48", "--max-new-tokens", "4096"},
                       {}, logs);
  ASSERT_TRUE(child.wait_for_err("\r[")) << child.err();
  child.signal(SIGINT);
  EXPECT_EQ(child.wait(), 130) << child.err();
  EXPECT_NE(child.err().find("cancelled"), std::string::npos) << child.err();
  fs::remove_all(logs);
}

TEST(CliGenerate, TextPromptGivesTextAndJsonAndARecord) {
  const fs::path rec = fs::temp_directory_path() / ("bl_gen_rec_" + std::to_string(getpid()));
  const auto r = run_process({BL_CLI_PATH, "generate", "--preset", "tiny", "--prompt",
                              "the cat sat", "--batch", "2", "--steps", "3", "--max-new-tokens",
                              "16", "--json", "--record", rec.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["rows"].size(), 2U);
  EXPECT_TRUE(j["rows"][0]["text"].is_string());
  EXPECT_EQ(j["rows"][0]["tokens"].size(), 16U);
  EXPECT_EQ(j["generation_config"]["max_denoising_steps"], 3);
  // The chat template's ids: <bos> <|turn> user \n ...
  EXPECT_EQ(j["prompt_ids"][0], 2);
  EXPECT_EQ(j["prompt_ids"][1], 105);
  const auto f = model::SafetensorsFile::open(rec);
  EXPECT_EQ(f->tensors().count("c0.s1.canvas_in"), 1U);
  EXPECT_EQ(f->tensor("sequences").size(0), 2);
  fs::remove(rec);
  const auto text = run_process({BL_CLI_PATH, "generate", "--preset", "tiny", "--prompt",
                                 "the cat sat", "--steps", "2", "--max-new-tokens", "16"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("  text: "), std::string::npos) << text.out;
  const auto none = run_process({BL_CLI_PATH, "generate", "--preset", "tiny"});
  EXPECT_EQ(none.exit_code, 2);
  const auto big =
      run_process({BL_CLI_PATH, "generate", "--preset", "tiny", "--prompt-ids", "2,999999"});
  EXPECT_EQ(big.exit_code, 1);
  EXPECT_NE(big.err.find("outside the vocabulary"), std::string::npos) << big.err;
}

// Issue #35: a padded batch of different prompts, as tools/parity/run_mixed_parity.sh replays
// it through transformers' generate: the record holds the left-padded batch, its mask and the
// raw logits of each canvas's first step.
TEST(CliGenerate, MixedBatchRecordsThePaddedBatchItsMaskAndFirstLogits) {
  const fs::path dir = fs::temp_directory_path() / ("bl_gen_mixed_" + std::to_string(getpid()));
  fs::create_directories(dir);
  {
    std::ofstream c(dir / "companions.jsonl");
    c << "{\"prompt_ids\": [2, 105, 40, 41, 42, 43, 44, 45, 46]}\n{\"prompt_ids\": [2, 50]}\n";
  }
  const fs::path rec = dir / "rec.safetensors";
  const std::vector<std::string> base{BL_CLI_PATH,
                                      "generate",
                                      "--preset",
                                      "tiny",
                                      "--prompt-ids",
                                      "2,105,50,51",
                                      "--batch",
                                      "3",
                                      "--row",
                                      "1",
                                      "--steps",
                                      "3",
                                      "--companions",
                                      (dir / "companions.jsonl").string(),
                                      "--max-new-tokens",
                                      "16"};
  auto args = base;
  args.insert(args.end(), {"--record", rec.string(), "--record-logits"});
  const auto r = run_process(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("batch: row 1 under test, 2 companion prompts (cycled), padded to 9 tokens "
                       "(5 padding slots before the row under test), positions shared"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("row 1 (under test)"), std::string::npos) << r.out;
  const auto f = model::SafetensorsFile::open(rec);
  const at::Tensor prompt = f->tensor("prompt");  // [3, 9] rows: companion 1, prompt, companion 2
  ASSERT_EQ(prompt.sizes(), (at::IntArrayRef{3, 9}));
  const at::Tensor mask = f->tensor("attention_mask");
  ASSERT_EQ(mask.sizes(), (at::IntArrayRef{3, 9}));
  const auto values = [](const at::Tensor& t) {
    const at::Tensor c = t.to(at::kLong).contiguous();
    return std::vector<std::int64_t>(c.data_ptr<std::int64_t>(),
                                     c.data_ptr<std::int64_t>() + c.numel());
  };
  EXPECT_EQ(values(mask.sum(1)), (std::vector<std::int64_t>{9, 4, 2}));
  EXPECT_EQ(values(prompt[1].narrow(0, 5, 4)), (std::vector<std::int64_t>{2, 105, 50, 51}));
  EXPECT_EQ(f->tensor("c0.s1.logits").size(0), 3);
  EXPECT_EQ(f->tensors().count("c0.s2.logits"), 0U);  // the first step of each canvas only
  // Without --record-logits none; a row outside the batch and an empty companions file refused
  // before any work.
  const auto bad_row =
      run_process({BL_CLI_PATH, "generate", "--preset", "tiny", "--prompt-ids", "2,105", "--batch",
                   "2", "--row", "2", "--companions", (dir / "companions.jsonl").string()});
  EXPECT_EQ(bad_row.exit_code, 1) << bad_row.err;
  EXPECT_NE(bad_row.err.find("the row under test must be in 0..1, not 2"), std::string::npos)
      << bad_row.err;
  { std::ofstream(dir / "empty.txt"); }
  const auto empty =
      run_process({BL_CLI_PATH, "generate", "--preset", "tiny", "--prompt-ids", "2,105", "--batch",
                   "2", "--companions", (dir / "empty.txt").string()});
  EXPECT_EQ(empty.exit_code, 2) << empty.err;
  EXPECT_NE(empty.err.find("companions file"), std::string::npos) << empty.err;
  fs::remove_all(dir);
}

TEST(CliGenerate, SavedCheckpointCarriesTokenizerAndGenerationConfigAndGeneratesTheSame) {
  const fs::path dir = fs::temp_directory_path() / ("bl_cli_gen_ckpt_" + std::to_string(getpid()));
  fs::remove_all(dir);
  const auto saved = run_process(
      {BL_CLI_PATH, "save-model", "--preset", "tiny", "--seed", "5", "--out", dir.string()});
  ASSERT_EQ(saved.exit_code, 0) << saved.err;
  for (const char* f : {"config.json", "tokenizer.json", "generation_config.json"}) {
    EXPECT_TRUE(fs::exists(dir / f)) << f;
  }
  const std::vector<std::string> common{"--prompt", "hello there",      "--steps",
                                        "3",        "--max-new-tokens", "32"};
  std::vector<std::string> from_preset{BL_CLI_PATH, "generate", "--preset", "tiny", "--seed", "5"};
  std::vector<std::string> from_dir{BL_CLI_PATH, "generate", "--checkpoint", dir.string()};
  from_preset.insert(from_preset.end(), common.begin(), common.end());
  from_dir.insert(from_dir.end(), common.begin(), common.end());
  const auto a = run_process(from_preset);
  const auto b = run_process(from_dir);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  // Same weights, tokenizer and generation config: the rows are the same (headers differ).
  EXPECT_EQ(a.out.substr(a.out.find("row 0")), b.out.substr(b.out.find("row 0")));
  fs::remove_all(dir);
}

TEST(CliTokenize, EncodesDecodesAndExports) {
  const auto enc = run_process({BL_CLI_PATH, "tokenize", "--preset", "demo", "--chat", "hi"});
  ASSERT_EQ(enc.exit_code, 0) << enc.err;
  EXPECT_EQ(enc.out.rfind("2,105,", 0), 0U) << enc.out;
  const auto words = run_process({BL_CLI_PATH, "tokenize", "--preset", "demo", "the cat"});
  ASSERT_EQ(words.exit_code, 0) << words.err;
  std::string ids = words.out.substr(0, words.out.find('\n'));
  const auto dec = run_process({BL_CLI_PATH, "tokenize", "--preset", "demo", "--decode", ids});
  ASSERT_EQ(dec.exit_code, 0) << dec.err;
  EXPECT_EQ(dec.out, "the cat\n");
  const fs::path out = fs::temp_directory_path() / ("bl_tok_" + std::to_string(getpid()) + ".json");
  const auto ex =
      run_process({BL_CLI_PATH, "tokenize", "--preset", "tiny", "--export", out.string()});
  ASSERT_EQ(ex.exit_code, 0) << ex.err;
  const auto again = run_process({BL_CLI_PATH, "tokenize", "--tokenizer", out.string(), "the"});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  fs::remove(out);
  const auto missing = run_process({BL_CLI_PATH, "tokenize", "--tokenizer", "/nonexistent", "x"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("FileNotFound"), std::string::npos) << missing.err;
}

TEST(CliRun, WritesAnExperimentFileThatSummaryReads) {
  const fs::path dir = fs::temp_directory_path() / ("bl_cli_run_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path file = dir / "tiny.h5";
  const auto r =
      run_process({BL_CLI_PATH, "run", "--preset", "tiny", "--steps", "3", "--max-new-tokens", "16",
                   "--batch-sizes", "2", "--policy", "emulated_split_k", "--out", file.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("ref__b2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("EMULATED"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("time: tokenizer and inputs "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" s, load "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" s, file "), std::string::npos) << r.out;
  // The whole process beside the run's parts: start-up before the run, then the rest.
  const auto at = r.out.find("; process ");
  ASSERT_NE(at, std::string::npos) << r.out;
  double process_s = -1.0;
  double before_s = -1.0;
  ASSERT_EQ(std::sscanf(r.out.c_str() + at, "; process %lf s (start-up before the run %lf s)",
                        &process_s, &before_s),
            2)
      << r.out.substr(at);
  EXPECT_GT(before_s, 0.0);
  EXPECT_GE(process_s, before_s);
  ASSERT_TRUE(fs::exists(file));
  const auto s = run_process({BL_CLI_PATH, "summary", file.string(), "--json"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  const auto j = nlohmann::json::parse(s.out);
  EXPECT_EQ(j["emulated"], true);
  EXPECT_EQ(j["comparisons"].size(), 2U);
  EXPECT_EQ(j["noise_floor_clean"], true);
  // Where row 0 diverges, the exact (fp64) reference is in the file (issue #35); --no-exact
  // leaves it out.
  ASSERT_FALSE(j["comparisons"][1]["first_divergence"].is_null()) << s.out;
  EXPECT_TRUE(j.contains("exact")) << s.out;
  EXPECT_TRUE(j["comparisons"][1].contains("exact")) << s.out;
  const auto text = run_process({BL_CLI_PATH, "summary", file.string()});
  EXPECT_NE(text.out.find("first divergence"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("exact (fp64): the op: "), std::string::npos) << text.out;
  const fs::path plain = dir / "plain.h5";
  ASSERT_EQ(run_process({BL_CLI_PATH, "run", "--preset", "tiny", "--steps", "3", "--max-new-tokens",
                         "16", "--batch-sizes", "2", "--policy", "emulated_split_k", "--no-exact",
                         "--out", plain.string()})
                .exit_code,
            0);
  const auto without = run_process({BL_CLI_PATH, "summary", plain.string(), "--json"});
  EXPECT_FALSE(nlohmann::json::parse(without.out).contains("exact")) << without.out;
  // Errors: a bad file, a bad spec.
  const auto bad = run_process({BL_CLI_PATH, "summary", (dir / "nope.h5").string()});
  EXPECT_EQ(bad.exit_code, 1);
  const auto spec = run_process({BL_CLI_PATH, "run", "--preset", "tiny", "--batch-sizes", "1",
                                 "--out", (dir / "x.h5").string()});
  // Refused as a bad command line, before any model is built (issue #34).
  EXPECT_EQ(spec.exit_code, 2);
  EXPECT_NE(spec.err.find("batch sizes"), std::string::npos) << spec.err;
  EXPECT_FALSE(fs::exists(dir / "x.h5"));
  const auto preset = run_process({BL_CLI_PATH, "run", "--preset", "nope", "--batch-sizes", "2",
                                   "--out", (dir / "x.h5").string()});
  EXPECT_EQ(preset.exit_code, 2);
  EXPECT_NE(preset.err.find("tiny"), std::string::npos) << preset.err;
  const auto policy = run_process({BL_CLI_PATH, "run", "--preset", "tiny", "--policy", "bogus",
                                   "--out", (dir / "x.h5").string()});
  EXPECT_EQ(policy.exit_code, 2);
  EXPECT_NE(policy.err.find("bogus"), std::string::npos) << policy.err;
  EXPECT_FALSE(fs::exists(dir / "x.h5"));
  fs::remove_all(dir);
}

TEST(CliRun, CtrlCCancelsAndLeavesNoFile) {
  const fs::path dir =
      fs::temp_directory_path() / ("bl_cli_run_cancel_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path logs = dir.string() + "-logs";
  fs::create_directories(logs);
  testing::Child child({BL_CLI_PATH, "run", "--preset", "demo", "--steps", "48", "--max-new-tokens",
                        "1024", "--out", (dir / "e.h5").string()},
                       {}, logs);
  // Interrupted once the run is under way (its progress shows), not after a fixed delay.
  ASSERT_TRUE(child.wait_for_err("\r[")) << child.err();
  child.signal(SIGINT);
  EXPECT_EQ(child.wait(), 130) << child.err();
  EXPECT_TRUE(fs::is_empty(dir)) << "no file, no temporary file";
  fs::remove_all(dir);
  fs::remove_all(logs);
}

}  // namespace
}  // namespace batchlens
