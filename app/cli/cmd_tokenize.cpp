// SPDX-License-Identifier: Apache-2.0
#include <fstream>
#include <iostream>
#include <memory>

#include "app/cli/command.h"
#include "app/cli/model_options.h"
#include "core/base/atomic_file.h"
#include "core/setup/front_door.h"
#include "core/text/chat_template.h"

namespace batchlens::cli {

void register_tokenize(CLI::App& app, int& exit_code) {
  struct Options {
    std::string preset;
    std::string checkpoint;
    std::string file;
    std::string text;
    std::string decode;
    std::string export_to;
    bool chat = false;
    bool pieces = false;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "tokenize", "Encode text to token ids (or decode ids) with a model's tokenizer");
  auto* preset = cmd->add_option("--preset", opts->preset,
                                 "The generated tokenizer of a preset (tiny, demo, mid, 26b-a4b)");
  auto* ckpt =
      cmd->add_option("--checkpoint", opts->checkpoint, "A checkpoint directory's tokenizer.json");
  auto* file = cmd->add_option("--tokenizer", opts->file, "A tokenizer.json file");
  preset->excludes(ckpt, file);
  ckpt->excludes(file);
  auto* text = cmd->add_option("text", opts->text, "Text to encode");
  auto* dec = cmd->add_option("--decode", opts->decode, "Comma-separated ids to decode instead");
  text->excludes(dec);
  cmd->add_flag("--chat", opts->chat, "Wrap the text in the Gemma chat template first");
  cmd->add_flag("--pieces", opts->pieces, "Print each id with its piece");
  cmd->add_option("--export", opts->export_to,
                  "Write the preset's generated tokenizer.json to this path and exit");
  cmd->callback([opts, &exit_code] {
    const Options& o = *opts;
    if (!o.export_to.empty()) {
      if (o.preset.empty()) {
        std::cerr << "batchlens-cli tokenize: --export needs --preset\n";
        exit_code = kExitUsage;
        return;
      }
      auto json = setup::preset_tokenizer_json(o.preset);
      auto written = json.ok() ? base::write_file_atomic(o.export_to, json.value())
                               : base::Result<void>(json.error());
      exit_code = written.ok() ? kExitOk : report_error(written.error());
      return;
    }
    base::Result<std::shared_ptr<const text::Tokenizer>> tok =
        base::Error{base::ErrorCode::InvalidArgument, ""};
    if (!o.file.empty()) {
      tok = setup::tokenizer_from_file(o.file);
    } else if (!o.preset.empty() || !o.checkpoint.empty()) {
      model::ModelSource source;
      source.preset = o.preset;
      source.checkpoint_dir = o.checkpoint;
      tok = setup::tokenizer_for(source);
    } else {
      std::cerr << "batchlens-cli tokenize: give --preset, --checkpoint or --tokenizer\n";
      exit_code = kExitUsage;
      return;
    }
    if (!tok.ok()) {
      exit_code = report_error(tok.error());
      return;
    }
    if (!o.decode.empty()) {
      std::vector<std::int64_t> ids;
      std::string bad;
      if (!parse_int_list(o.decode, ids, bad)) {
        std::cerr << "batchlens-cli tokenize: bad token id '" << bad << "'\n";
        exit_code = kExitUsage;
        return;
      }
      std::cout << tok.value()->decode(ids) << "\n";
      exit_code = kExitOk;
      return;
    }
    const auto ids = tok.value()->encode(o.chat ? text::chat_prompt(o.text) : o.text);
    if (!ids.ok()) {
      exit_code = report_error(ids.error());
      return;
    }
    for (std::size_t i = 0; i < ids.value().size(); ++i) {
      const std::int64_t id = ids.value()[i];
      if (o.pieces) {
        std::cout << id << "\t" << tok.value()->piece(id) << "\n";
      } else {
        std::cout << (i > 0 ? "," : "") << id;
      }
    }
    if (!o.pieces) {
      std::cout << "\n";
    }
    exit_code = kExitOk;
  });
}

}  // namespace batchlens::cli
