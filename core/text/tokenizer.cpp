// SPDX-License-Identifier: Apache-2.0
// ref: huggingface/tokenizers (the Rust library behind tokenizer.json): AddedVocabulary
// (leftmost-longest split), normalizers::{Replace, Prepend}, pre_tokenizers::{Split, Metaspace},
// models::bpe::Word::merge_all (lowest rank first, then leftmost), decoders::{Replace,
// ByteFallback, Fuse, Strip, Metaspace}. Ported from their documented behaviour.
#include "core/text/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <functional>
#include <queue>
#include <regex>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/base/input.h"

namespace batchlens::text {

namespace {

using json = nlohmann::json;
using base::ErrorCode;

constexpr std::int64_t kMaxVocab = 1 << 24;  // 16 M ids: far above any real tokenizer

/// A string from the file as a message shows it: at most 60 bytes, so that a message never
/// copies a large part of an untrusted file.
std::string shown(const std::string& text) {
  constexpr std::size_t kMax = 60;
  return text.size() <= kMax ? text : text.substr(0, kMax - 3) + "...";
}

[[noreturn]] void corrupt(const std::string& message) {
  base::raise(ErrorCode::FileCorrupted, "tokenizer.json: " + message);
}

[[noreturn]] void unsupported(const std::string& what) {
  base::raise(ErrorCode::FileUnrecognised,
              "tokenizer.json: " + what +
                  " is not supported (BatchLens reads SentencePiece-style BPE tokenizers such as "
                  "Gemma's)");
}

// Length of the UTF-8 sequence starting at s[i]; invalid or truncated sequences count as one
// byte each (they then go to byte fallback, as in the reference's byte-level handling).
std::size_t utf8_char_len(std::string_view s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  std::size_t n = 1;
  if ((c & 0xE0U) == 0xC0U) {
    n = 2;
  } else if ((c & 0xF0U) == 0xE0U) {
    n = 3;
  } else if ((c & 0xF8U) == 0xF0U) {
    n = 4;
  }
  if (n == 1 || i + n > s.size()) {
    return 1;
  }
  for (std::size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0U) != 0x80U) {
      return 1;
    }
  }
  return n;
}

bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_char_len(s, i);
    if (n == 1 && static_cast<unsigned char>(s[i]) >= 0x80U) {
      return false;
    }
    i += n;
  }
  return true;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) {
    return s;
  }
  std::string out;
  std::size_t pos = 0;
  for (std::size_t hit = s.find(from); hit != std::string::npos; hit = s.find(from, pos)) {
    out.append(s, pos, hit - pos);
    out += to;
    pos = hit + from.size();
  }
  out.append(s, pos, std::string::npos);
  return out;
}

std::string byte_piece(unsigned b) {
  std::array<char, 8> buf{};
  std::snprintf(buf.data(), buf.size(), "<0x%02X>", b);
  return buf.data();
}

// --- pipeline components ----------------------------------------------------------------

struct Normalizer {
  enum class Kind { Replace, Prepend } kind = Kind::Replace;
  std::string from;  // Replace: pattern; Prepend: the prefix
  std::string to;
};

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct PreTokenizer {
  enum class Kind { Split, Metaspace } kind = Kind::Split;
  // Split
  std::string pattern;
  std::optional<std::regex> regex;  // set for {"Regex": ...} patterns
  SplitBehavior behavior = SplitBehavior::Isolated;
  // Metaspace
  std::string replacement = "\xE2\x96\x81";  // U+2581
  enum class Prepend { Always, First, Never } prepend = Prepend::Always;
  bool split = true;
};

struct Decoder {
  enum class Kind { Replace, ByteFallback, Fuse, Strip, Metaspace } kind = Kind::Fuse;
  std::string from;  // Replace pattern / Strip content / Metaspace replacement
  std::string to;
  int start = 0;
  int stop = 0;
  bool prepend = true;  // Metaspace: strip the leading space of the first token
};

std::string string_pattern(const json& pattern, const std::string& where, bool* is_regex) {
  if (!pattern.is_object()) {
    corrupt(where + ": pattern must be an object");
  }
  if (pattern.contains("String") && pattern["String"].is_string()) {
    *is_regex = false;
    return pattern["String"].get<std::string>();
  }
  if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
    *is_regex = true;
    return pattern["Regex"].get<std::string>();
  }
  corrupt(where + ": pattern has neither String nor Regex");
}

std::string type_of(const json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    corrupt(where + " has no type");
  }
  return j["type"].get<std::string>();
}

void parse_normalizer(const json& j, std::vector<Normalizer>& out) {
  if (j.is_null()) {
    return;
  }
  const std::string type = type_of(j, "normalizer");
  if (type == "Sequence") {
    for (const json& n : j.value("normalizers", json::array())) {
      parse_normalizer(n, out);
    }
  } else if (type == "Replace") {
    bool is_regex = false;
    Normalizer n;
    n.from = string_pattern(j.value("pattern", json()), "normalizer Replace", &is_regex);
    if (is_regex) {
      unsupported("a Regex pattern in the Replace normalizer");
    }
    n.to = j.value("content", std::string());
    out.push_back(std::move(n));
  } else if (type == "Prepend") {
    Normalizer n;
    n.kind = Normalizer::Kind::Prepend;
    n.from = j.value("prepend", std::string());
    out.push_back(std::move(n));
  } else {
    unsupported("the normalizer type '" + shown(type) + "'");
  }
}

void parse_pre_tokenizer(const json& j, std::vector<PreTokenizer>& out) {
  if (j.is_null()) {
    return;
  }
  const std::string type = type_of(j, "pre_tokenizer");
  if (type == "Sequence") {
    for (const json& p : j.value("pretokenizers", json::array())) {
      parse_pre_tokenizer(p, out);
    }
  } else if (type == "Split") {
    PreTokenizer p;
    bool is_regex = false;
    p.pattern = string_pattern(j.value("pattern", json()), "pre_tokenizer Split", &is_regex);
    if (is_regex) {
      try {
        p.regex.emplace(p.pattern, std::regex::ECMAScript);
      } catch (const std::regex_error&) {
        unsupported("the Split regex '" + shown(p.pattern) + "'");
      }
    }
    const std::string b = j.value("behavior", std::string("Isolated"));
    if (b == "Removed") {
      p.behavior = SplitBehavior::Removed;
    } else if (b == "Isolated") {
      p.behavior = SplitBehavior::Isolated;
    } else if (b == "MergedWithPrevious") {
      p.behavior = SplitBehavior::MergedWithPrevious;
    } else if (b == "MergedWithNext") {
      p.behavior = SplitBehavior::MergedWithNext;
    } else if (b == "Contiguous") {
      p.behavior = SplitBehavior::Contiguous;
    } else {
      corrupt("unknown Split behavior '" + shown(b) + "'");
    }
    if (j.value("invert", false)) {
      unsupported("an inverted Split pre-tokenizer");
    }
    out.push_back(std::move(p));
  } else if (type == "Metaspace") {
    PreTokenizer p;
    p.kind = PreTokenizer::Kind::Metaspace;
    p.replacement = j.value("replacement", p.replacement);
    const std::string scheme = j.value("prepend_scheme", std::string("always"));
    if (scheme == "always") {
      p.prepend = PreTokenizer::Prepend::Always;
    } else if (scheme == "first") {
      p.prepend = PreTokenizer::Prepend::First;
    } else if (scheme == "never") {
      p.prepend = PreTokenizer::Prepend::Never;
    } else {
      corrupt("unknown Metaspace prepend_scheme '" + shown(scheme) + "'");
    }
    p.split = j.value("split", true);
    out.push_back(std::move(p));
  } else {
    unsupported("the pre_tokenizer type '" + shown(type) + "'");
  }
}

void parse_decoder(const json& j, std::vector<Decoder>& out) {
  if (j.is_null()) {
    return;
  }
  const std::string type = type_of(j, "decoder");
  Decoder d;
  if (type == "Sequence") {
    for (const json& x : j.value("decoders", json::array())) {
      parse_decoder(x, out);
    }
    return;
  }
  if (type == "Replace") {
    bool is_regex = false;
    d.kind = Decoder::Kind::Replace;
    d.from = string_pattern(j.value("pattern", json()), "decoder Replace", &is_regex);
    if (is_regex) {
      unsupported("a Regex pattern in the Replace decoder");
    }
    d.to = j.value("content", std::string());
  } else if (type == "ByteFallback") {
    d.kind = Decoder::Kind::ByteFallback;
  } else if (type == "Fuse") {
    d.kind = Decoder::Kind::Fuse;
  } else if (type == "Strip") {
    d.kind = Decoder::Kind::Strip;
    d.from = j.value("content", std::string(" "));
    d.start = j.value("start", 0);
    d.stop = j.value("stop", 0);
  } else if (type == "Metaspace") {
    d.kind = Decoder::Kind::Metaspace;
    d.from = j.value("replacement", std::string("\xE2\x96\x81"));
    d.prepend = j.value("prepend_scheme", std::string("always")) != "never";
  } else {
    unsupported("the decoder type '" + shown(type) + "'");
  }
  out.push_back(std::move(d));
}

// Spans [begin, end) of `s` with whether each is a match of the pattern; covers all of s.
std::vector<std::pair<std::string_view, bool>> find_spans(std::string_view s,
                                                          const PreTokenizer& p) {
  std::vector<std::pair<std::string_view, bool>> spans;
  std::size_t pos = 0;
  auto add_match = [&](std::size_t at, std::size_t len) {
    if (at > pos) {
      spans.emplace_back(s.substr(pos, at - pos), false);
    }
    spans.emplace_back(s.substr(at, len), true);
    pos = at + len;
  };
  if (p.regex) {
    const std::string text(s);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), *p.regex);
         it != std::sregex_iterator(); ++it) {
      if (it->length(0) > 0) {
        add_match(static_cast<std::size_t>(it->position(0)),
                  static_cast<std::size_t>(it->length(0)));
      }
    }
  } else if (!p.pattern.empty()) {
    for (std::size_t hit = s.find(p.pattern); hit != std::string_view::npos;
         hit = s.find(p.pattern, pos)) {
      add_match(hit, p.pattern.size());
    }
  }
  if (pos < s.size()) {
    spans.emplace_back(s.substr(pos), false);
  }
  return spans;
}

// ref: tokenizers NormalizedString::split with SplitDelimiterBehavior
std::vector<std::string> split_words(std::string_view s, const PreTokenizer& p) {
  const auto spans = find_spans(s, p);
  std::vector<std::string> out;
  bool previous_match = false;
  switch (p.behavior) {
    case SplitBehavior::Removed:
      for (const auto& [text, match] : spans) {
        if (!match) {
          out.emplace_back(text);
        }
      }
      break;
    case SplitBehavior::Isolated:
      for (const auto& span : spans) {
        out.emplace_back(span.first);
      }
      break;
    case SplitBehavior::Contiguous:
      for (const auto& [text, match] : spans) {
        if (match && previous_match) {
          out.back() += text;
        } else {
          out.emplace_back(text);
        }
        previous_match = match;
      }
      break;
    case SplitBehavior::MergedWithPrevious:
      for (const auto& [text, match] : spans) {
        if (match && !previous_match && !out.empty()) {
          out.back() += text;
        } else {
          out.emplace_back(text);
        }
        previous_match = match;
      }
      break;
    case SplitBehavior::MergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->second && !previous_match && !out.empty()) {
          out.back() = std::string(it->first) + out.back();
        } else {
          out.emplace_back(it->first);
        }
        previous_match = it->second;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
  out.erase(std::remove_if(out.begin(), out.end(), [](const std::string& w) { return w.empty(); }),
            out.end());
  return out;
}

std::uint64_t pair_key(std::int64_t a, std::int64_t b) {
  return (static_cast<std::uint64_t>(a) << 32U) | static_cast<std::uint64_t>(b);
}

}  // namespace

struct Tokenizer::Impl {
  std::vector<Normalizer> normalizers;
  std::vector<PreTokenizer> pre_tokenizers;
  std::vector<Decoder> decoders;

  std::unordered_map<std::string, std::int64_t> ids;  // model vocab and added tokens
  std::vector<std::string> pieces;                    // by id
  std::vector<char> known;                            // by id: has a piece
  std::vector<char> special;                          // by id

  struct Added {
    std::string content;
    std::int64_t id = 0;
    bool lstrip = false;
    bool rstrip = false;
  };
  // Added tokens by content, and their distinct lengths longest first: leftmost-longest
  // matching tries each length at each position (Gemma has thousands of added tokens but
  // only a few dozen lengths).
  std::unordered_map<std::string, Added> added;
  std::vector<std::size_t> added_lengths;

  struct Merge {
    std::int32_t rank = 0;
    std::int64_t id = 0;
  };
  std::unordered_map<std::uint64_t, Merge> merges;
  std::optional<std::int64_t> unk;
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;
  std::array<std::int64_t, 256> byte_ids{};

  void set_piece(std::int64_t id, const std::string& piece, const std::string& where) {
    if (id < 0 || id >= kMaxVocab) {
      corrupt(where + " '" + shown(piece) + "' has the id " + std::to_string(id) +
              " (out of range)");
    }
    if (static_cast<std::size_t>(id) >= pieces.size()) {
      pieces.resize(static_cast<std::size_t>(id) + 1);
      known.resize(pieces.size(), 0);
      special.resize(pieces.size(), 0);
    }
    const auto at = static_cast<std::size_t>(id);
    if (known[at] != 0 && pieces[at] != piece) {
      corrupt("the id " + std::to_string(id) + " is given to both '" + shown(pieces[at]) +
              "' and '" + shown(piece) + "'");
    }
    const auto [it, inserted] = ids.emplace(piece, id);
    if (!inserted && it->second != id) {
      corrupt(where + " '" + shown(piece) + "' has two ids, " + std::to_string(it->second) +
              " and " + std::to_string(id));
    }
    pieces[at] = piece;
    known[at] = 1;
  }

  std::string normalize(std::string s) const {
    for (const Normalizer& n : normalizers) {
      if (n.kind == Normalizer::Kind::Replace) {
        s = replace_all(std::move(s), n.from, n.to);
      } else if (!s.empty()) {
        s.insert(0, n.from);
      }
    }
    return s;
  }

  std::vector<std::string> pre_tokenize(const std::string& s, bool first_segment) const {
    std::vector<std::string> words{s};
    for (const PreTokenizer& p : pre_tokenizers) {
      std::vector<std::string> next;
      for (const std::string& w : words) {
        if (p.kind == PreTokenizer::Kind::Split) {
          auto parts = split_words(w, p);
          next.insert(next.end(), parts.begin(), parts.end());
          continue;
        }
        std::string m = replace_all(w, " ", p.replacement);
        const bool prepend = p.prepend == PreTokenizer::Prepend::Always ||
                             (p.prepend == PreTokenizer::Prepend::First && first_segment);
        if (prepend && m.compare(0, p.replacement.size(), p.replacement) != 0) {
          m.insert(0, p.replacement);
        }
        if (!p.split) {
          next.push_back(std::move(m));
          continue;
        }
        PreTokenizer by_space;
        by_space.pattern = p.replacement;
        by_space.behavior = SplitBehavior::MergedWithNext;
        auto parts = split_words(m, by_space);
        next.insert(next.end(), parts.begin(), parts.end());
      }
      words = std::move(next);
    }
    return words;
  }

  // ref: tokenizers models::bpe::BPE::merge_word + Word::merge_all
  void bpe(const std::string& word, std::vector<std::int64_t>& out) const {
    if (ignore_merges) {
      if (auto it = ids.find(word); it != ids.end()) {
        out.push_back(it->second);
        return;
      }
    }
    std::vector<std::int64_t> sym;
    for (std::size_t i = 0; i < word.size();) {
      const std::size_t n = utf8_char_len(word, i);
      const std::string ch = word.substr(i, n);
      i += n;
      if (auto it = ids.find(ch); it != ids.end()) {
        sym.push_back(it->second);
        continue;
      }
      if (byte_fallback && std::all_of(ch.begin(), ch.end(), [&](char c) {
            return byte_ids[static_cast<unsigned char>(c)] >= 0;
          })) {
        for (char c : ch) {
          sym.push_back(byte_ids[static_cast<unsigned char>(c)]);
        }
        continue;
      }
      if (!unk) {
        base::raise(ErrorCode::InvalidArgument,
                    "tokenizer: the character '" + ch +
                        "' has no token, and the tokenizer has no byte fallback or unknown token");
      }
      if (!(fuse_unk && !sym.empty() && sym.back() == *unk)) {
        sym.push_back(*unk);
      }
    }
    // Linked symbols; a min-heap of candidate merges ordered by (rank, position).
    const auto n = static_cast<std::int64_t>(sym.size());
    std::vector<std::int64_t> prev(sym.size());
    std::vector<std::int64_t> next(sym.size());
    for (std::int64_t i = 0; i < n; ++i) {
      prev[i] = i - 1;
      next[i] = i + 1 < n ? i + 1 : -1;
    }
    struct Candidate {
      std::int32_t rank;
      std::int64_t pos;
      std::int64_t left;
      std::int64_t right;
      bool operator>(const Candidate& o) const {
        return rank != o.rank ? rank > o.rank : pos > o.pos;
      }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
    auto push = [&](std::int64_t pos) {
      if (pos < 0 || next[pos] < 0) {
        return;
      }
      const std::int64_t right = next[pos];
      if (auto it = merges.find(pair_key(sym[pos], sym[right])); it != merges.end()) {
        heap.push({it->second.rank, pos, sym[pos], sym[right]});
      }
    };
    for (std::int64_t i = 0; i + 1 < n; ++i) {
      push(i);
    }
    std::vector<char> alive(sym.size(), 1);
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      const std::int64_t right = next[c.pos];
      if (alive[c.pos] == 0 || right < 0 || sym[c.pos] != c.left || sym[right] != c.right) {
        continue;  // stale: one side has merged since
      }
      sym[c.pos] = merges.at(pair_key(c.left, c.right)).id;
      alive[right] = 0;
      next[c.pos] = next[right];
      if (next[right] >= 0) {
        prev[next[right]] = c.pos;
      }
      push(prev[c.pos]);
      push(c.pos);
    }
    for (std::int64_t i = 0; i < n; ++i) {
      if (alive[i] != 0) {
        out.push_back(sym[i]);
      }
    }
  }

  void encode_text(const std::string& raw, bool first_segment,
                   std::vector<std::int64_t>& out) const {
    if (raw.empty()) {
      return;
    }
    for (const std::string& w : pre_tokenize(normalize(raw), first_segment)) {
      bpe(w, out);
    }
  }
};

base::Result<Tokenizer> Tokenizer::from_json(std::string_view json_text) {
  return base::guarded([&]() -> Tokenizer {
    // The document is gone before the tokenizer is built: a real 262,144-piece file is not held
    // twice, as JSON and as the spec, while the tokenizer's tables are filled.
    const BpeTokenizerSpec spec = [&] {
      // Depth-limited (a tokenizer nests about 5 deep), no exceptions, no input in the message.
      auto parsed = base::parse_json(json_text, "tokenizer.json", ErrorCode::FileCorrupted);
      if (!parsed.ok()) {
        throw base::ErrorException(parsed.error());
      }
      const json j = std::move(parsed).value();
      if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) {
        corrupt("no \"model\" object: this is not a Hugging Face tokenizer.json");
      }
      // The fields' types here; what they say (ids, merges, added tokens) in from_spec.
      BpeTokenizerSpec spec;
      try {
        const json& m = j["model"];
        const std::string type = m.value("type", std::string("BPE"));
        if (type != "BPE") {
          unsupported("the model type '" + shown(type) + "'");
        }
        for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
          if (m.contains(key) && !m[key].is_null() && !m[key].get<std::string>().empty()) {
            unsupported(std::string("BPE ") + key);
          }
        }
        if (!m.contains("vocab") || !m["vocab"].is_object()) {
          corrupt("model.vocab is missing or not an object");
        }
        spec.vocab.reserve(m["vocab"].size());
        for (const auto& [piece, id] : m["vocab"].items()) {
          if (!id.is_number_integer()) {
            corrupt("model.vocab['" + shown(piece) + "'] is not an integer");
          }
          spec.vocab.emplace_back(piece, id.get<std::int64_t>());
        }
        spec.byte_fallback = m.value("byte_fallback", false);
        spec.fuse_unk = m.value("fuse_unk", false);
        spec.ignore_merges = m.value("ignore_merges", false);
        if (m.contains("unk_token") && m["unk_token"].is_string()) {
          spec.unk_token = m["unk_token"].get<std::string>();
        }
        // By reference: a copy of a 262,144-merge array costs as much as reading it.
        static const json no_merges = json::array();
        const json& merges = m.contains("merges") ? m["merges"] : no_merges;
        if (!merges.is_array()) {
          corrupt("model.merges is not an array");
        }
        spec.merges.reserve(merges.size());
        for (const json& merge : merges) {
          if (merge.is_string()) {
            const auto& text = merge.get_ref<const std::string&>();
            const std::size_t sp = text.find(' ');
            if (sp == std::string::npos || text.find(' ', sp + 1) != std::string::npos) {
              corrupt("the merge \"" + shown(text) + "\" is not two pieces separated by one space");
            }
            spec.merges.emplace_back(text.substr(0, sp), text.substr(sp + 1));
          } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
                     merge[1].is_string()) {
            spec.merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
          } else {
            corrupt("merge " + std::to_string(spec.merges.size()) +
                    " is neither \"a b\" nor [a, b]");
          }
        }
        for (const json& t : j.value("added_tokens", json::array())) {
          if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
              !t.contains("content") || !t["content"].is_string()) {
            corrupt("an added_tokens entry lacks an integer id or a string content");
          }
          if (t.value("single_word", false)) {
            unsupported("single_word added tokens");
          }
          BpeTokenizerSpec::Added a;
          a.id = t["id"].get<std::int64_t>();
          a.content = t["content"].get<std::string>();
          a.lstrip = t.value("lstrip", false);
          a.rstrip = t.value("rstrip", false);
          a.special = t.value("special", false);
          spec.added.push_back(std::move(a));
        }
        spec.normalizer = j.value("normalizer", json()).dump();
        spec.pre_tokenizer = j.value("pre_tokenizer", json()).dump();
        spec.decoder = j.value("decoder", json()).dump();
      } catch (const json::exception& e) {
        corrupt(std::string("a field has the wrong type (") + e.what() + ")");
      }
      return spec;
    }();
    return base::take(from_spec(spec));
  });
}

base::Result<Tokenizer> Tokenizer::from_spec(const BpeTokenizerSpec& spec) {
  return base::guarded([&]() -> Tokenizer {
    auto impl = std::make_shared<Impl>();
    impl->byte_ids.fill(-1);
    impl->ids.reserve(spec.vocab.size() + spec.added.size());
    for (const auto& [piece, id] : spec.vocab) {
      impl->set_piece(id, piece, "the piece");
    }
    impl->byte_fallback = spec.byte_fallback;
    impl->fuse_unk = spec.fuse_unk;
    impl->ignore_merges = spec.ignore_merges;
    for (unsigned b = 0; b < 256; ++b) {
      if (auto it = impl->ids.find(byte_piece(b)); it != impl->ids.end()) {
        impl->byte_ids[b] = it->second;
      }
    }
    if (spec.unk_token) {
      auto it = impl->ids.find(*spec.unk_token);
      if (it == impl->ids.end()) {
        corrupt("model.unk_token '" + shown(*spec.unk_token) + "' is not in the vocabulary");
      }
      impl->unk = it->second;
    }
    impl->merges.reserve(spec.merges.size());
    std::int32_t rank = 0;
    for (const auto& [a, b] : spec.merges) {
      const auto ia = impl->ids.find(a);
      const auto ib = impl->ids.find(b);
      const auto iab = impl->ids.find(a + b);
      if (ia == impl->ids.end() || ib == impl->ids.end() || iab == impl->ids.end()) {
        std::string what = "merge " + std::to_string(rank) + " (";
        what.append(shown(a)).append(" + ").append(shown(b)).append(
            ") names a piece that is not in the vocabulary");
        corrupt(what);
      }
      impl->merges.emplace(pair_key(ia->second, ib->second), Impl::Merge{rank, iab->second});
      ++rank;
    }
    for (const BpeTokenizerSpec::Added& a : spec.added) {
      if (a.content.empty()) {
        corrupt("an added token with the id " + std::to_string(a.id) + " is empty");
      }
      impl->set_piece(a.id, a.content, "the added token");
      impl->special[static_cast<std::size_t>(a.id)] = a.special ? 1 : 0;
      impl->added_lengths.push_back(a.content.size());
      impl->added[a.content] = Impl::Added{a.content, a.id, a.lstrip, a.rstrip};
    }
    std::sort(impl->added_lengths.begin(), impl->added_lengths.end(), std::greater<>());
    impl->added_lengths.erase(std::unique(impl->added_lengths.begin(), impl->added_lengths.end()),
                              impl->added_lengths.end());
    const auto pipeline = [](const std::string& text) {
      return base::take(base::parse_json(text, "tokenizer.json", ErrorCode::FileCorrupted));
    };
    try {
      parse_normalizer(pipeline(spec.normalizer), impl->normalizers);
      parse_pre_tokenizer(pipeline(spec.pre_tokenizer), impl->pre_tokenizers);
      parse_decoder(pipeline(spec.decoder), impl->decoders);
    } catch (const json::exception& e) {
      corrupt(std::string("a field has the wrong type (") + e.what() + ")");
    }
    if (impl->pieces.empty()) {
      corrupt("the vocabulary is empty");
    }
    return Tokenizer(std::move(impl));
  });
}

base::Result<Tokenizer> Tokenizer::from_file(const std::filesystem::path& path) {
  // Refuses a FIFO, a device or a directory without blocking on it.
  auto text = base::read_input_file(path, "tokenizer file");
  if (!text.ok()) {
    return text.error();
  }
  auto t = from_json(text.value());
  if (!t.ok()) {
    return base::Error{t.error().code, path.string() + ": " + t.error().message};
  }
  return t;
}

base::Result<std::vector<std::int64_t>> Tokenizer::encode(std::string_view text) const {
  return base::guarded([&] {
    std::vector<std::int64_t> out;
    std::string pending;  // text since the last added token
    bool first_segment = true;
    auto flush = [&] {
      impl_->encode_text(pending, first_segment, out);
      pending.clear();
      first_segment = false;
    };
    auto is_space = [](char c) {
      return c == ' ' || c == '\t' || c == '\n' || c == '\r';
    };
    for (std::size_t i = 0; i < text.size();) {
      const Impl::Added* hit = nullptr;
      for (std::size_t len : impl_->added_lengths) {
        if (i + len > text.size()) {
          continue;
        }
        if (auto it = impl_->added.find(std::string(text.substr(i, len)));
            it != impl_->added.end()) {
          hit = &it->second;
          break;
        }
      }
      if (hit == nullptr) {
        pending += text[i];
        ++i;
        continue;
      }
      if (hit->lstrip) {
        while (!pending.empty() && is_space(pending.back())) {
          pending.pop_back();
        }
      }
      flush();
      out.push_back(hit->id);
      i += hit->content.size();
      if (hit->rstrip) {
        while (i < text.size() && is_space(text[i])) {
          ++i;
        }
      }
    }
    flush();
    return out;
  });
}

std::string Tokenizer::decode(const std::vector<std::int64_t>& ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (std::int64_t id : ids) {
    if (id < 0 || id >= vocab_size() || impl_->known[static_cast<std::size_t>(id)] == 0) {
      continue;
    }
    if (skip_special && impl_->special[static_cast<std::size_t>(id)] != 0) {
      continue;
    }
    tokens.push_back(impl_->pieces[static_cast<std::size_t>(id)]);
  }
  for (const Decoder& d : impl_->decoders) {
    switch (d.kind) {
      case Decoder::Kind::Replace:
        for (std::string& t : tokens) {
          t = replace_all(std::move(t), d.from, d.to);
        }
        break;
      case Decoder::Kind::ByteFallback: {
        // ref: tokenizers decoders::ByteFallback: runs of <0xXX> become their bytes when they
        // form valid UTF-8, else one U+FFFD per byte.
        std::vector<std::string> out;
        std::string bytes;
        std::size_t run = 0;
        auto flush = [&] {
          if (run == 0) {
            return;
          }
          if (valid_utf8(bytes)) {
            out.push_back(bytes);
          } else {
            for (std::size_t k = 0; k < run; ++k) {
              out.emplace_back("\xEF\xBF\xBD");
            }
          }
          bytes.clear();
          run = 0;
        };
        for (std::string& t : tokens) {
          unsigned value = 0;
          if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
              std::sscanf(t.c_str() + 3, "%2x", &value) == 1) {
            bytes += static_cast<char>(value);
            ++run;
          } else {
            flush();
            out.push_back(std::move(t));
          }
        }
        flush();
        tokens = std::move(out);
        break;
      }
      case Decoder::Kind::Fuse: {
        std::string all;
        for (const std::string& t : tokens) {
          all += t;
        }
        tokens.assign(1, all);
        break;
      }
      case Decoder::Kind::Strip:
        for (std::string& t : tokens) {
          for (int k = 0; k < d.start && t.compare(0, d.from.size(), d.from) == 0; ++k) {
            t.erase(0, d.from.size());
          }
          for (int k = 0; k < d.stop && t.size() >= d.from.size() &&
                          t.compare(t.size() - d.from.size(), d.from.size(), d.from) == 0;
               ++k) {
            t.erase(t.size() - d.from.size());
          }
        }
        break;
      case Decoder::Kind::Metaspace:
        for (std::size_t i = 0; i < tokens.size(); ++i) {
          tokens[i] = replace_all(std::move(tokens[i]), d.from, " ");
          if (i == 0 && d.prepend && !tokens[i].empty() && tokens[i][0] == ' ') {
            tokens[i].erase(0, 1);
          }
        }
        break;
    }
  }
  std::string text;
  for (const std::string& t : tokens) {
    text += t;
  }
  return text;
}

std::string Tokenizer::piece(std::int64_t id) const {
  if (id < 0 || id >= vocab_size()) {
    return {};
  }
  return impl_->pieces[static_cast<std::size_t>(id)];
}

std::optional<std::int64_t> Tokenizer::token_id(std::string_view piece) const {
  const auto it = impl_->ids.find(std::string(piece));
  if (it == impl_->ids.end()) {
    return std::nullopt;
  }
  return it->second;
}

std::int64_t Tokenizer::vocab_size() const {
  return static_cast<std::int64_t>(impl_->pieces.size());
}

bool Tokenizer::is_special(std::int64_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[static_cast<std::size_t>(id)] != 0;
}

}  // namespace batchlens::text
