// SPDX-License-Identifier: Apache-2.0
// A reader of Hugging Face `tokenizer.json` files of the SentencePiece-BPE kind that Gemma
// ships: added/special tokens matched first (longest match), normalizers (Replace, Prepend),
// pre-tokenizers (Split, Metaspace), a BPE model with ranked merges, byte fallback `<0xXX>`
// and `unk`, and the matching decoders (Replace, ByteFallback, Fuse, Strip, Metaspace).
// Anything else in a file is refused at load time with its name, never silently skipped:
// a tokenizer that is almost right gives wrong ids that nothing downstream can detect.
// Torch-free (the UI uses it for text diffs).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/error.h"

namespace batchlens::text {

/// A BPE tokenizer's content as tokenizer.json's "model" and "added_tokens" hold it, typed:
/// what Tokenizer::from_json reads a file into, and what TokenizerBuilder makes for a preset
/// without writing JSON (the 26B-A4B preset's 262,144 pieces took ~4 s of a 2-core CPU to
/// write as JSON and parse again, issue #37). The three pipelines stay JSON texts: they are
/// small.
struct BpeTokenizerSpec {
  struct Added {
    std::int64_t id = 0;
    std::string content;
    bool lstrip = false;
    bool rstrip = false;
    bool special = false;
  };
  std::vector<std::pair<std::string, std::int64_t>> vocab;  ///< piece and id
  std::vector<std::pair<std::string, std::string>> merges;  ///< in rank order
  std::vector<Added> added;
  std::optional<std::string> unk_token;
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;
  std::string normalizer = "null";     ///< tokenizer.json's "normalizer" as JSON text
  std::string pre_tokenizer = "null";  ///< its "pre_tokenizer"
  std::string decoder = "null";        ///< its "decoder"
};

class Tokenizer {
 public:
  /// Parses a tokenizer.json text. Errors: FileCorrupted (not JSON, missing or mistyped
  /// fields, duplicate ids, merges naming unknown pieces), FileUnrecognised (a component type
  /// this reader does not implement, named in the message).
  static base::Result<Tokenizer> from_json(std::string_view json_text);
  /// The tokenizer of a typed spec (from_json's second half). Errors as from_json's for the
  /// content: FileCorrupted for an id given twice, a merge naming an unknown piece, an empty
  /// added token, an unknown unk_token; FileUnrecognised for a pipeline it does not implement.
  static base::Result<Tokenizer> from_spec(const BpeTokenizerSpec& spec);
  /// Reads and parses a file. Errors as from_json, plus FileNotFound / IoFailed.
  static base::Result<Tokenizer> from_file(const std::filesystem::path& path);

  /// Token ids of `text`; added tokens are matched first, then each stretch of text between
  /// them is normalized, pre-tokenized and BPE-encoded. No BOS is added (chat templates
  /// carry their own). Errors: InvalidArgument when a character has no token and the
  /// tokenizer has neither byte fallback nor an unknown token.
  base::Result<std::vector<std::int64_t>> encode(std::string_view text) const;

  /// Text of `ids` through the file's decoder. Ids without a token are skipped (as the
  /// reference does); special tokens are kept unless `skip_special`.
  std::string decode(const std::vector<std::int64_t>& ids, bool skip_special = false) const;

  /// The piece of one id as stored ("▁Portugal", "<0x0A>", "<turn|>"); empty when unknown.
  std::string piece(std::int64_t id) const;
  /// The id of a piece or added token, if any.
  std::optional<std::int64_t> token_id(std::string_view piece) const;
  /// One past the largest id.
  std::int64_t vocab_size() const;
  /// True for added tokens marked special.
  bool is_special(std::int64_t id) const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace batchlens::text
