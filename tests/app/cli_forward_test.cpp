// SPDX-License-Identifier: Apache-2.0
// `batchlens-cli save-model` + `forward` end to end on the tiny preset.
#include <filesystem>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

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
  EXPECT_EQ(rng.exit_code, 1);
  EXPECT_NE(rng.err.find("per_row or shared"), std::string::npos) << rng.err;
}

TEST(CliGenerate, CtrlCCancelsWithExitCode130) {
  // A long demo generation interrupted after a second by SIGINT.
  const auto r =
      testing::run_process({"/usr/bin/timeout", "--preserve-status", "-s", "INT", "2", BL_CLI_PATH,
                            "generate", "--preset", "demo", "--prompt-ids", "2,105,50", "--batch",
                            "4", "--steps", "48", "--max-new-tokens", "4096"});
  EXPECT_EQ(r.exit_code, 130) << r.err;
  EXPECT_NE(r.err.find("cancelled"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace batchlens
