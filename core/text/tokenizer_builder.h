// SPDX-License-Identifier: Apache-2.0
// Writes tokenizer.json files of Gemma's kind: the project's own fixtures (tests) and the
// readable tokenizers of the model presets, which have no released tokenizer. Torch-free.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/base/error.h"
#include "core/text/tokenizer.h"

namespace batchlens::text {

/// Collects pieces, merges and special tokens and renders a tokenizer.json with Gemma's
/// pipeline: spaces -> "▁", text split into runs of newlines and runs of everything else,
/// BPE with byte fallback, decoded back through Replace/ByteFallback/Fuse.
class TokenizerBuilder {
 public:
  /// A special (added) token at `id`. Throws InvalidArgument when the id is taken.
  void add_special(std::int64_t id, const std::string& content);
  /// The 256 byte-fallback pieces <0x00>..<0xFF> at the next free ids.
  void add_byte_fallback();
  /// A piece reachable by BPE: every UTF-8 prefix of it becomes a piece, chained by merges
  /// (prefix + next character), in the order added. The piece itself gets `id` when given
  /// (>= 0), else the next free id; returns its id. Throws InvalidArgument when the piece
  /// exists with another id or `id` is taken.
  std::int64_t add_piece(const std::string& piece, std::int64_t id = -1);
  /// How many new ids add_piece(piece) would take.
  std::int64_t cost(const std::string& piece) const;
  /// Whether `piece` is already there.
  bool has(const std::string& piece) const { return ids_.count(piece) != 0; }
  /// Whether `id` is in use.
  bool taken(std::int64_t id) const { return by_id_.count(id) != 0; }
  /// The lowest id not used yet.
  std::int64_t next_free_id() const;
  /// Ids in use.
  std::int64_t size() const { return static_cast<std::int64_t>(by_id_.size()); }
  /// The tokenizer.json text.
  std::string to_json() const;
  /// The same content typed, for Tokenizer::from_spec (no JSON written or parsed).
  BpeTokenizerSpec spec() const;

 private:
  std::int64_t take(std::int64_t id, const std::string& piece);

  std::map<std::int64_t, std::string> by_id_;
  std::unordered_map<std::string, std::int64_t> ids_;
  std::vector<std::pair<std::string, std::string>> merges_;
  std::vector<std::int64_t> specials_;
  bool byte_fallback_ = false;
  mutable std::int64_t free_hint_ = 0;
};

/// Gemma's special tokens at Gemma's ids (spec §8): <pad> 0, <eos> 1, <bos> 2, <unk> 3,
/// <mask> 4, tool tokens 46-52, <|think|> 98, channel 100/101, turn 105/106.
const std::vector<std::pair<std::int64_t, const char*>>& gemma_special_tokens();

/// The tokenizer.json of a preset model with `vocab_size` ids (>= 108): Gemma's special
/// tokens at Gemma's ids (<pad> 0, <eos> 1, <bos> 2, <|turn> 105, <turn|> 106, "\n" 107, ...),
/// byte fallback when the vocabulary has room, letters, digits and punctuation, the chat
/// words (user, model, system, thought), then "▁word" pieces of English words (Debian's
/// wamerican list, resources/text/words.txt) until the vocabulary is full; ids left over
/// become <unusedN> special tokens. Deterministic. Errors: InvalidArgument (too small).
base::Result<std::string> preset_tokenizer_json(std::int64_t vocab_size);

/// The tokenizer preset_tokenizer_json describes, built from its typed spec (the 26B-A4B
/// preset's took ~4 s through the JSON text on a 2-core CPU). Errors: InvalidArgument (too
/// small).
base::Result<Tokenizer> preset_tokenizer(std::int64_t vocab_size);

}  // namespace batchlens::text
