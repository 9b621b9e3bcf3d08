// SPDX-License-Identifier: Apache-2.0
#include "core/setup/random_model.h"

#include <system_error>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "core/base/atomic_file.h"
#include "core/base/input.h"
#include "core/generation/generation_config.h"
#include "core/model/config.h"
#include "core/model/safetensors.h"
#include "core/model/weights.h"
#include "core/text/tokenizer_builder.h"

namespace batchlens::setup {

base::Result<void> save_random_model(const std::string& preset, std::uint64_t seed,
                                     const std::filesystem::path& dir,
                                     std::uint64_t max_shard_bytes, int fail_after_files) {
  namespace fs = std::filesystem;
  std::vector<fs::path> created;  // parent folders this call made, innermost last
  auto result = base::guarded([&] {
    auto config = model::load_preset(preset);
    if (!config.ok()) {
      throw base::ErrorException(config.error());
    }
    std::error_code ec;
    if (fs::exists(fs::symlink_status(dir, ec)) &&
        (!fs::is_directory(dir, ec) || !fs::is_empty(dir, ec))) {
      base::raise(base::ErrorCode::InvalidArgument,
                  dir.string() + " exists and is not an empty folder: give a new folder");
    }
    const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
    for (fs::path p = parent; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
      created.insert(created.begin(), p);
      if (p == p.parent_path()) {
        break;
      }
    }
    fs::create_directories(parent, ec);
    if (ec) {
      base::raise(base::ErrorCode::IoFailed,
                  parent.string() + ": cannot create the folder: " + ec.message());
    }
    // Built beside `dir`, moved into place complete; removed on any failure (or a signal).
    base::AtomicDir out(dir);
    int files = 0;
    const auto written = [&] {
      if (fail_after_files >= 0 && ++files > fail_after_files) {
        base::raise(base::ErrorCode::IoFailed,
                    "injected failure after " + std::to_string(fail_after_files) + " file(s)");
      }
    };
    if (const model::PresetBundle bundle = model::preset_bundle(preset); bundle.trained()) {
      // A trained preset: its bundled files as they are (the seed has no say).
      for (const auto& [name, content] :
           {std::pair<const char*, std::string_view>{"model.safetensors", bundle.weights},
            {"tokenizer.json", bundle.tokenizer_json},
            {"generation_config.json", bundle.generation_config_json},
            {"config.json", bundle.config_json}}) {
        if (auto w = base::write_file_atomic(out.path() / name, content); !w.ok()) {
          throw base::ErrorException(w.error());
        }
        written();
      }
      out.commit();
      return;
    }
    const model::ModelWeights weights =
        model::random_weights(config.value(), seed, at::kCPU, at::kBFloat16);
    model::write_checkpoint(
        out.path(), model::named_tensors(weights, config.value().text), max_shard_bytes,
        {{"format", "pt"}, {"batchlens_preset", preset}, {"batchlens_seed", std::to_string(seed)}});
    written();
    // The project's tokenizer and the released generation defaults, so that the directory is
    // complete for the reference too.
    auto tokenizer = text::preset_tokenizer_json(config.value().text.vocab_size);
    if (!tokenizer.ok()) {
      throw base::ErrorException(tokenizer.error());
    }
    for (const auto& [name, content] :
         {std::pair<const char*, std::string>{"tokenizer.json", tokenizer.value()},
          {"generation_config.json", generation::to_json(generation::GenerationConfig{})},
          {"config.json", base::dump_json_lossy(model::to_json(config.value()), 2) + "\n"}}) {
      if (auto w = base::write_file_atomic(out.path() / name, content); !w.ok()) {
        throw base::ErrorException(w.error());
      }
      written();
    }
    out.commit();
  });
  if (!result.ok()) {
    // Parent folders made for it go too (only while empty: nothing else is touched).
    std::error_code ec;
    for (auto it = created.rbegin(); it != created.rend(); ++it) {
      if (!fs::remove(*it, ec)) {
        break;
      }
    }
  }
  return result;
}

}  // namespace batchlens::setup
