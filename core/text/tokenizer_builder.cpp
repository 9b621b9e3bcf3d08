// SPDX-License-Identifier: Apache-2.0
#include "core/text/tokenizer_builder.h"

#include <array>
#include <cstdio>
#include <set>

#include <nlohmann/json.hpp>

#include "core/text/embedded_words.h"

namespace batchlens::text {

namespace {

using base::ErrorCode;

constexpr const char* kSpace = "\xE2\x96\x81";  // U+2581, what spaces become

std::vector<std::string> utf8_prefixes(const std::string& s) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = 1;
    if (c >= 0xF0U) {
      n = 4;
    } else if (c >= 0xE0U) {
      n = 3;
    } else if (c >= 0xC0U) {
      n = 2;
    }
    i = std::min(s.size(), i + n);
    out.push_back(s.substr(0, i));
  }
  return out;
}

// The character that extends prefix `a` to `b`.
std::string tail(const std::string& a, const std::string& b) {
  return b.substr(a.size());
}

}  // namespace

std::int64_t TokenizerBuilder::next_free_id() const {
  while (by_id_.count(free_hint_) != 0) {
    ++free_hint_;
  }
  return free_hint_;
}

std::int64_t TokenizerBuilder::take(std::int64_t id, const std::string& piece) {
  if (id < 0) {
    id = next_free_id();
  }
  if (by_id_.count(id) != 0) {
    base::raise(ErrorCode::InvalidArgument, "tokenizer builder: the id " + std::to_string(id) +
                                                " is taken by '" + by_id_.at(id) + "'");
  }
  by_id_.emplace(id, piece);
  ids_.emplace(piece, id);
  return id;
}

void TokenizerBuilder::add_special(std::int64_t id, const std::string& content) {
  take(id, content);
  specials_.push_back(id);
}

void TokenizerBuilder::add_byte_fallback() {
  for (unsigned b = 0; b < 256; ++b) {
    std::array<char, 8> buf{};
    std::snprintf(buf.data(), buf.size(), "<0x%02X>", b);
    take(-1, buf.data());
  }
  byte_fallback_ = true;
}

std::int64_t TokenizerBuilder::cost(const std::string& piece) const {
  std::set<std::string> missing;
  const auto prefixes = utf8_prefixes(piece);
  for (std::size_t k = 0; k < prefixes.size(); ++k) {
    for (const std::string& p :
         {prefixes[k], k == 0 ? prefixes[0] : tail(prefixes[k - 1], prefixes[k])}) {
      if (ids_.count(p) == 0) {
        missing.insert(p);
      }
    }
  }
  return static_cast<std::int64_t>(missing.size());
}

std::int64_t TokenizerBuilder::add_piece(const std::string& piece, std::int64_t id) {
  if (piece.empty()) {
    base::raise(ErrorCode::InvalidArgument, "tokenizer builder: empty piece");
  }
  if (auto it = ids_.find(piece); it != ids_.end()) {
    if (id >= 0 && it->second != id) {
      base::raise(
          ErrorCode::InvalidArgument,
          "tokenizer builder: '" + piece + "' already has the id " + std::to_string(it->second));
    }
    return it->second;
  }
  if (id >= 0 && by_id_.count(id) != 0) {
    base::raise(ErrorCode::InvalidArgument, "tokenizer builder: the id " + std::to_string(id) +
                                                " is taken by '" + by_id_.at(id) + "'");
  }
  const auto prefixes = utf8_prefixes(piece);
  auto ensure = [&](const std::string& p, std::int64_t want) {
    if (ids_.count(p) == 0) {
      take(p == piece ? want : -1, p);
      return true;
    }
    return false;
  };
  ensure(prefixes[0], id);
  for (std::size_t k = 1; k < prefixes.size(); ++k) {
    ensure(tail(prefixes[k - 1], prefixes[k]), -1);
    if (ensure(prefixes[k], id)) {
      merges_.emplace_back(prefixes[k - 1], tail(prefixes[k - 1], prefixes[k]));
    }
  }
  return ids_.at(piece);
}

namespace {

// Gemma's pipeline as tokenizer.json writes it: spaces to "▁", the text split into runs of
// newlines and runs of everything else, decoded back through Replace/ByteFallback/Fuse.
nlohmann::json gemma_normalizer() {
  return {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}};
}
nlohmann::json gemma_pre_tokenizer() {
  return {{"type", "Split"},
          {"pattern", {{"Regex", "\n+"}}},
          {"behavior", "Isolated"},
          {"invert", false}};
}
nlohmann::json gemma_decoder() {
  return {
      {"type", "Sequence"},
      {"decoders", nlohmann::json::array(
                       {{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                        {{"type", "ByteFallback"}},
                        {{"type", "Fuse"}}})}};
}

}  // namespace

BpeTokenizerSpec TokenizerBuilder::spec() const {
  BpeTokenizerSpec s;
  s.vocab.reserve(by_id_.size());
  for (const auto& [id, piece] : by_id_) {
    s.vocab.emplace_back(piece, id);
  }
  s.merges = merges_;
  for (std::int64_t id : specials_) {
    s.added.push_back({id, by_id_.at(id), /*lstrip=*/false, /*rstrip=*/false, /*special=*/true});
  }
  if (ids_.count("<unk>") != 0) {
    s.unk_token = "<unk>";
  }
  s.byte_fallback = byte_fallback_;
  s.fuse_unk = true;
  s.ignore_merges = false;
  s.normalizer = gemma_normalizer().dump();
  s.pre_tokenizer = gemma_pre_tokenizer().dump();
  s.decoder = gemma_decoder().dump();
  return s;
}

std::string TokenizerBuilder::to_json() const {
  // The typed spec written out (one description of the content: spec()). nlohmann::json keeps
  // keys sorted (a std::map): O(log n) inserts, where ordered_json's linear search made the
  // 262144-piece vocabulary quadratic.
  using json = nlohmann::json;
  const BpeTokenizerSpec s = spec();
  json vocab = json::object();
  for (const auto& [piece, id] : s.vocab) {
    vocab[piece] = id;
  }
  json added = json::array();
  for (const BpeTokenizerSpec::Added& a : s.added) {
    added.push_back({{"id", a.id},
                     {"content", a.content},
                     {"single_word", false},
                     {"lstrip", a.lstrip},
                     {"rstrip", a.rstrip},
                     {"normalized", false},
                     {"special", a.special}});
  }
  json merges = json::array();
  for (const auto& [a, b] : s.merges) {
    merges.push_back(json::array({a, b}));
  }
  json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", s.unk_token ? json(*s.unk_token) : json(nullptr)},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", s.fuse_unk},
                {"byte_fallback", s.byte_fallback},
                {"ignore_merges", s.ignore_merges}};
  model["vocab"] = std::move(vocab);
  model["merges"] = std::move(merges);
  json doc = {{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", std::move(added)},
              {"normalizer", json::parse(s.normalizer)},
              {"pre_tokenizer", json::parse(s.pre_tokenizer)},
              {"post_processor", nullptr},
              {"decoder", json::parse(s.decoder)}};
  doc["model"] = std::move(model);
  return doc.dump(1);
}

const std::vector<std::pair<std::int64_t, const char*>>& gemma_special_tokens() {
  static const std::vector<std::pair<std::int64_t, const char*>> tokens = {{0, "<pad>"},
                                                                           {1, "<eos>"},
                                                                           {2, "<bos>"},
                                                                           {3, "<unk>"},
                                                                           {4, "<mask>"},
                                                                           {46, "<|tool>"},
                                                                           {47, "<tool|>"},
                                                                           {48, "<|tool_call>"},
                                                                           {49, "<tool_call|>"},
                                                                           {50, "<|tool_response>"},
                                                                           {51, "<tool_response|>"},
                                                                           {52, "<|\"|>"},
                                                                           {98, "<|think|>"},
                                                                           {100, "<|channel>"},
                                                                           {101, "<channel|>"},
                                                                           {105, "<|turn>"},
                                                                           {106, "<turn|>"}};
  return tokens;
}

namespace {

// The builder of a preset's tokenizer (preset_tokenizer_json says what it holds).
TokenizerBuilder preset_builder(std::int64_t vocab_size) {
  {
    constexpr std::int64_t kGemmaSpecialEnd = 108;  // ids 0..107 as Gemma numbers them
    if (vocab_size < kGemmaSpecialEnd + 64) {
      base::raise(ErrorCode::InvalidArgument,
                  "a preset tokenizer needs a vocabulary of at least 172 ids, not " +
                      std::to_string(vocab_size));
    }
    TokenizerBuilder b;
    const auto& gemma = gemma_special_tokens();
    for (const auto& [id, content] : gemma) {
      b.add_special(id, content);
    }
    b.add_piece("\n", 107);
    for (std::int64_t id = 0; id < kGemmaSpecialEnd; ++id) {
      if (!b.taken(id)) {
        b.add_special(id, "<unused" + std::to_string(id) + ">");
      }
    }
    if (vocab_size >= kGemmaSpecialEnd + 256 + 512) {
      b.add_byte_fallback();
    }
    std::string chars = " abcdefghijklmnopqrstuvwxyz.,'";
    if (vocab_size >= 1024) {
      chars += "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789;:!?\"-()";
    }
    for (char c : chars) {
      b.add_piece(c == ' ' ? std::string(kSpace) : std::string(1, c));
    }
    for (const char* w : {"user", "model", "system", "thought"}) {
      if (b.size() + b.cost(w) <= vocab_size) {
        b.add_piece(w);
      }
    }
    // Words in a strided order, so that any prefix of the list spans the alphabet.
    std::vector<std::string_view> words;
    const std::string_view all = detail::embedded_words();
    for (std::size_t pos = 0; pos < all.size();) {
      std::size_t end = all.find('\n', pos);
      end = end == std::string_view::npos ? all.size() : end;
      if (end > pos) {
        words.push_back(all.substr(pos, end - pos));
      }
      pos = end + 1;
    }
    const std::size_t n = words.size();
    std::size_t stride = 7919;
    while (n > 0 && n % stride == 0) {
      stride += 2;
    }
    for (std::size_t k = 0; k < n && b.size() < vocab_size; ++k) {
      const std::string piece = std::string(kSpace).append(words[(k * stride) % n]);
      if (b.size() + b.cost(piece) <= vocab_size) {
        b.add_piece(piece);
      }
    }
    for (std::int64_t id = b.next_free_id(); id < vocab_size; id = b.next_free_id()) {
      b.add_special(id, "<unused" + std::to_string(id) + ">");
    }
    return b;
  }
}

}  // namespace

base::Result<std::string> preset_tokenizer_json(std::int64_t vocab_size) {
  return base::guarded([&] { return preset_builder(vocab_size).to_json(); });
}

base::Result<Tokenizer> preset_tokenizer(std::int64_t vocab_size) {
  return base::guarded(
      [&] { return base::take(Tokenizer::from_spec(preset_builder(vocab_size).spec())); });
}

}  // namespace batchlens::text
