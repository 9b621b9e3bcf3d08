// SPDX-License-Identifier: Apache-2.0
// Writes the seed inputs of the JSON and safetensors fuzz targets with BatchLens's own writers:
// tools/fuzz_seeds.sh runs it (with batchlens-cli for the model directory and the experiment
// files) to (re)make tests/fuzz/corpus/. Not a test and not run by CI.
// Usage: fuzz_make_seeds OUT_DIR   (writes OUT_DIR/<target>/<name>)
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>

#include "core/experiment/experiment.h"
#include "core/generation/generation_config.h"
#include "core/model/config.h"
#include "core/model/safetensors.h"
#include "core/ops/policy.h"
#include "tests/support/gemma_tokenizer.h"

namespace {

namespace fs = std::filesystem;
using namespace batchlens;

void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
  std::printf("%s (%zu bytes)\n", path.c_str(), text.size());
}

void safetensors_seeds(const fs::path& dir) {
  fs::create_directories(dir);
  const auto t = [](at::ScalarType type, std::vector<std::int64_t> shape) {
    return at::arange(at::IntArrayRef(shape).empty() ? 1 : c10::multiply_integers(shape),
                      at::kDouble)
        .reshape(shape)
        .to(type);
  };
  model::write_safetensors(dir / "one_f32.safetensors", {{"weight", t(at::kFloat, {2, 3})}});
  model::write_safetensors(dir / "every_dtype.safetensors",
                           {{"bf16", t(at::kBFloat16, {2, 2})},
                            {"f16", t(at::kHalf, {3})},
                            {"f32", t(at::kFloat, {1, 2, 1})},
                            {"f64", t(at::kDouble, {2})},
                            {"i64", t(at::kLong, {2})},
                            {"i32", t(at::kInt, {2})},
                            {"i16", t(at::kShort, {2})},
                            {"i8", t(at::kChar, {3})},
                            {"u8", t(at::kByte, {3})},
                            {"bool", t(at::kBool, {4})},
                            {"scalar", t(at::kFloat, {})},
                            {"empty", t(at::kFloat, {0, 4})}},
                           {{"format", "pt"}, {"note", "seed"}});
  model::write_safetensors(dir / "layer.safetensors",
                           {{"model.layers.0.self_attn.q_proj.weight", t(at::kBFloat16, {4, 4})},
                            {"model.layers.0.input_layernorm.weight", t(at::kBFloat16, {4})}},
                           {{"format", "pt"}});
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::printf("%s (%ju bytes)\n", entry.path().c_str(),
                static_cast<std::uintmax_t>(fs::file_size(entry.path())));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds OUT_DIR\n");
    return 2;
  }
  const fs::path out = argv[1];
  safetensors_seeds(out / "safetensors");

  for (const std::string& name : model::preset_names()) {
    write_text(out / "config" / ("preset_" + name + ".json"),
               model::to_json(model::load_preset(name).value()).dump(2));
  }

  write_text(out / "tokenizer" / "gemma_fixture.json", testing::gemma_fixture_tokenizer_json());

  generation::GenerationConfig gen;
  write_text(out / "generation_config" / "default.json", generation::to_json(gen));
  gen.sampler.max_denoising_steps = 4;
  gen.sampler.t_min = 0.1;
  gen.sampler.t_max = 0.9;
  gen.max_new_tokens = 16;
  gen.eos_token_ids = {1};
  write_text(out / "generation_config" / "short.json", generation::to_json(gen));

  const std::vector<std::pair<std::string, ops::OpPolicy>> policies{
      {"default", ops::OpPolicy::default_policy()},
      {"issue_workaround", ops::OpPolicy::issue_workaround()},
      {"row_wise_all", ops::OpPolicy::row_wise_all()},
      {"emulated_split_k", ops::OpPolicy::emulated_split_k()},
      {"combined",
       ops::combine(ops::OpPolicy::emulated_split_k(), ops::OpPolicy::issue_workaround())}};
  for (const auto& [name, policy] : policies) {
    write_text(out / "policy" / (name + ".json"), ops::to_json(policy).dump(2));
  }

  experiment::ExperimentSpec spec;
  spec.model.preset = "tiny";
  write_text(out / "spec" / "default.json", experiment::to_json(spec).dump(2));
  spec.mode = experiment::RunMode::Lockstep;
  spec.rng = generation::RngMode::Shared;
  spec.prefill = generation::PrefillMode::Batched;
  spec.policy = ops::OpPolicy::emulated_split_k();
  spec.workaround = ops::OpPolicy::issue_workaround();
  spec.batch_sizes = {2, 4};
  spec.repeats = 2;
  spec.taps = {"logits", "router_logits"};
  spec.prompt_ids = {2, 105, 2364, 107};
  spec.overrides.max_denoising_steps = 2;
  spec.overrides.max_new_tokens = 16;
  spec.overrides.t_min = 0.2;
  spec.load.dtype = "fp32";
  write_text(out / "spec" / "lockstep_workaround.json", experiment::to_json(spec).dump(2));
  return 0;
}
