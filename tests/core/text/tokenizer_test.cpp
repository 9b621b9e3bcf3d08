// SPDX-License-Identifier: Apache-2.0
#include "core/text/tokenizer.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/model/config.h"
#include "core/text/chat_template.h"
#include "core/text/tokenizer_builder.h"
#include "tests/support/gemma_tokenizer.h"
#include "tests/support/sanitizer.h"
#include "tests/support/special_files.h"

namespace batchlens::text {
namespace {

using Ids = std::vector<std::int64_t>;
const std::string kSp = "\xE2\x96\x81";  // "▁"

const Tokenizer& gemma() {
  static const Tokenizer t = [] {
    auto r = Tokenizer::from_json(testing::gemma_fixture_tokenizer_json());
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    return r.value();
  }();
  return t;
}

Ids encode(const Tokenizer& t, const std::string& s) {
  auto r = t.encode(s);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? r.value() : Ids{};
}

// A hand-written file: "a b c" and their merges, rank order given by the caller.
std::string abc_json(const std::string& merges) {
  return R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4,
            "abc": 5}, "merges": )" +
         merges + "}}";
}

TEST(ChatTemplate, GivesTheSpecsIdsForThePortugalPrompt) {
  // spec §8 / HF integration test: apply_chat_template without thinking.
  const Ids expected{2,      105, 2364, 107, 6974, 496, 1440, 20494, 1003, 23613,
                     236761, 106, 107,  105, 4368, 107, 100,  45518, 107,  101};
  EXPECT_EQ(encode(gemma(), chat_prompt("Write a long essay about Portugal.")), expected);
  // Content is trimmed, as the template's |trim does.
  EXPECT_EQ(encode(gemma(), chat_prompt("  Write a long essay about Portugal.\n")), expected);
}

TEST(ChatTemplate, ThinkingVariantMatchesTheSpec) {
  const Ids expected{2,   105,  9731,  107,  98,    107,    106, 107, 105, 2364, 107, 6974,
                     496, 1440, 20494, 1003, 23613, 236761, 106, 107, 105, 4368, 107};
  ChatOptions o;
  o.thinking = true;
  EXPECT_EQ(encode(gemma(), chat_prompt("Write a long essay about Portugal.", o)), expected);
}

TEST(ChatTemplate, SystemPromptGetsItsOwnTurn) {
  ChatOptions o;
  o.system = " Be brief. ";
  EXPECT_EQ(chat_prompt("hi", o),
            "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nhi<turn|>\n<|turn>model\n"
            "<|channel>thought\n<channel|>");
}

TEST(Tokenizer, SpecialTokensMatchLongestFirst) {
  // "<|tool_call>" (48) must win over its prefix "<|tool>"... which is not a prefix here, but
  // "<|tool_response>" (50) and "<|tool>" (46) share "<|tool"; both must be found whole.
  EXPECT_EQ(encode(gemma(), "<|tool_response><|tool><|tool_call>"), (Ids{50, 46, 48}));
  EXPECT_EQ(encode(gemma(), "<bos>user"), (Ids{2, 2364}));
}

TEST(Tokenizer, AsciiRoundTrip) {
  const std::string s = "Hello, world! 42 times\n\nthe quick brown fox?";
  const Ids ids = encode(gemma(), s);
  EXPECT_FALSE(ids.empty());
  EXPECT_EQ(gemma().decode(ids), s);
}

TEST(Tokenizer, Utf8RoundTripThroughByteFallback) {
  const std::string s =
      "Ol\xC3\xA1, a\xC3\xA7\xC3\xA3o \xE2\x98\x83 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x99\x82";
  EXPECT_EQ(gemma().decode(encode(gemma(), s)), s);
  // U+2603 SNOWMAN has no piece: its three UTF-8 bytes become <0xE2><0x98><0x83>.
  const Ids snow = encode(gemma(), "\xE2\x98\x83");
  ASSERT_EQ(snow.size(), 3U);
  EXPECT_EQ(gemma().piece(snow[0]), "<0xE2>");
  EXPECT_EQ(gemma().piece(snow[1]), "<0x98>");
  EXPECT_EQ(gemma().piece(snow[2]), "<0x83>");
}

TEST(Tokenizer, InvalidByteRunsDecodeAsReplacementCharacters) {
  const auto e2 = gemma().token_id("<0xE2>");
  ASSERT_TRUE(e2.has_value());
  // A lone lead byte is not UTF-8: one U+FFFD, as the reference's ByteFallback decoder gives.
  EXPECT_EQ(gemma().decode({*e2}), "\xEF\xBF\xBD");
}

TEST(Tokenizer, DecodeSkipsSpecialsOnRequestAndUnknownIds) {
  const Ids ids{2, 6974, 106, 99999999, -5};
  EXPECT_EQ(gemma().decode(ids), "<bos>Write<turn|>");
  EXPECT_EQ(gemma().decode(ids, /*skip_special=*/true), "Write");
  EXPECT_TRUE(gemma().is_special(106));
  EXPECT_FALSE(gemma().is_special(6974));
}

TEST(Tokenizer, MergesApplyInRankOrder) {
  auto bc_first = Tokenizer::from_json(abc_json(R"(["b c", "a bc"])"));
  ASSERT_TRUE(bc_first.ok()) << bc_first.error().message;
  EXPECT_EQ(encode(bc_first.value(), "abc"), (Ids{5}));
  auto ab_first = Tokenizer::from_json(abc_json(R"([["a", "b"], ["b", "c"]])"));
  ASSERT_TRUE(ab_first.ok()) << ab_first.error().message;
  EXPECT_EQ(encode(ab_first.value(), "abc"), (Ids{3, 2}));  // ab + c: "ab c" is no merge
}

TEST(Tokenizer, UnknownCharactersWithoutByteFallbackFuseIntoOneUnk) {
  auto t = Tokenizer::from_json(
      R"({"model": {"type": "BPE", "vocab": {"<unk>": 0, "a": 1}, "merges": [],
          "unk_token": "<unk>", "fuse_unk": true}})");
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(encode(t.value(), "a\xE2\x98\x83xya"), (Ids{1, 0, 1}));
  auto none =
      Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
  ASSERT_TRUE(none.ok());
  const auto r = none.value().encode("ab");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, base::ErrorCode::InvalidArgument);
}

TEST(Tokenizer, LlamaStylePrependNormalizerAndStripDecoder) {
  auto t = Tokenizer::from_json(R"({
    "normalizer": {"type": "Sequence", "normalizers": [
      {"type": "Prepend", "prepend": "▁"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
    "pre_tokenizer": null,
    "decoder": {"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "vocab": {"▁": 0, "h": 1, "i": 2, "▁h": 3, "▁hi": 4},
              "merges": ["▁ h", "▁h i"]}})");
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(encode(t.value(), "hi hi"), (Ids{4, 4}));
  EXPECT_EQ(t.value().decode({4, 4}), "hi hi");
}

TEST(Tokenizer, MetaspacePreTokenizerSplitsWords) {
  auto t = Tokenizer::from_json(R"({
    "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                      "split": true},
    "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"},
    "model": {"type": "BPE", "vocab": {"▁": 0, "a": 1, "▁a": 2, "▁aa": 3},
              "merges": ["▁ a", "▁a a"], "ignore_merges": false}})");
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(encode(t.value(), "aa a"), (Ids{3, 2}));
  EXPECT_EQ(t.value().decode({3, 2}), "aa a");
}

TEST(Tokenizer, SplitBehaviours) {
  auto make = [](const std::string& behavior) {
    auto t = Tokenizer::from_json(
        R"({"pre_tokenizer": {"type": "Split", "pattern": {"String": "-"}, "behavior": ")" +
        behavior +
        R"(", "invert": false}, "model": {"type": "BPE", "vocab": {"a": 0, "-": 1, "a-": 2,
        "-a": 3}, "merges": ["a -", "- a"]}})");
    EXPECT_TRUE(t.ok()) << t.error().message;
    return t.value();
  };
  // "a-a": Isolated [a][-][a]; MergedWithPrevious [a-][a]; MergedWithNext [a][-a];
  // Removed [a][a]. Within a word, "a -" (rank 0) merges first.
  EXPECT_EQ(encode(make("Isolated"), "a-a"), (Ids{0, 1, 0}));
  EXPECT_EQ(encode(make("MergedWithPrevious"), "a-a"), (Ids{2, 0}));
  EXPECT_EQ(encode(make("MergedWithNext"), "a-a"), (Ids{0, 3}));
  EXPECT_EQ(encode(make("Removed"), "a-a"), (Ids{0, 0}));
  EXPECT_EQ(encode(make("Contiguous"), "a--a"), (Ids{0, 1, 1, 0}));
}

TEST(Tokenizer, RefusesDamagedAndForeignFiles) {
  struct Case {
    const char* json;
    base::ErrorCode code;
  };
  const Case cases[] = {
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}", base::ErrorCode::FileCorrupted},
      {"[1, 2, 3]", base::ErrorCode::FileCorrupted},
      {R"({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}})",
       base::ErrorCode::FileUnrecognised},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})",
       base::ErrorCode::FileCorrupted},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 0}}})", base::ErrorCode::FileCorrupted},
      {R"({"model": {"type": "BPE", "vocab": {"a": -1}}})", base::ErrorCode::FileCorrupted},
      {R"({"model": {"type": "BPE", "vocab": {"a": "x"}}})", base::ErrorCode::FileCorrupted},
      {R"({"normalizer": {"type": "NFKC"}, "model": {"type": "BPE", "vocab": {"a": 0}}})",
       base::ErrorCode::FileUnrecognised},
      {R"({"pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": {"a": 0}}})",
       base::ErrorCode::FileUnrecognised},
      {R"({"added_tokens": [{"id": 0, "content": "b"}], "model": {"type": "BPE",
          "vocab": {"a": 0}}})",
       base::ErrorCode::FileCorrupted},
  };
  for (const Case& c : cases) {
    const auto t = Tokenizer::from_json(c.json);
    ASSERT_FALSE(t.ok()) << c.json;
    EXPECT_EQ(t.error().code, c.code) << c.json << ": " << t.error().message;
    EXPECT_NE(t.error().message.find("tokenizer.json"), std::string::npos) << t.error().message;
  }
  const auto missing = Tokenizer::from_file("/nonexistent/tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, base::ErrorCode::FileNotFound);
}

TEST(Tokenizer, TruncatedFileNamesThePath) {
  const std::string path = ::testing::TempDir() + "/truncated_tokenizer.json";
  const std::string full = testing::gemma_fixture_tokenizer_json();
  std::ofstream(path) << full.substr(0, full.size() / 2);
  const auto t = Tokenizer::from_file(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code, base::ErrorCode::FileCorrupted);
  EXPECT_NE(t.error().message.find(path), std::string::npos);
}

// issue #14: every JSON reader limits nesting; deep documents are refused before parsing, and
// the message neither recurses over nor echoes the document.
TEST(Tokenizer, DeeplyNestedJsonIsRefused) {
  const std::size_t depth = 100000;
  for (const std::string& text :
       {std::string(depth, '[') + std::string(depth, ']'),
        R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "normalizer": )" +
            std::string(depth, '{') + std::string(depth, '}') + "}"}) {
    const auto t = Tokenizer::from_json(text);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.error().code, base::ErrorCode::FileCorrupted);
    EXPECT_NE(t.error().message.find("more than 64 deep"), std::string::npos) << t.error().message;
    EXPECT_LT(t.error().message.size(), 200U);
  }
  // A long piece in a bad entry is cut in the message.
  const std::string long_piece(100000, 'x');
  const auto bad = Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {")" + long_piece +
                                        R"(": "not an id"}}})");
  ASSERT_FALSE(bad.ok());
  EXPECT_LT(bad.error().message.size(), 200U) << bad.error().message.substr(0, 200);
}

// issue #14: a FIFO given as a checkpoint's tokenizer.json is refused, not waited on.
TEST(Tokenizer, FifoIsRefusedWithoutBlocking) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "bl_tok_fifo";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto path = dir / "tokenizer.json";
  batchlens::test::make_fifo(path);
  const base::Error error =
      batchlens::test::expect_refused_without_blocking(path, [&]() -> base::Result<void> {
        auto t = Tokenizer::from_file(path);
        if (!t.ok()) {
          return t.error();
        }
        return {};
      });
  EXPECT_EQ(error.code, base::ErrorCode::FileUnrecognised);
  EXPECT_NE(error.message.find("FIFO"), std::string::npos) << error.message;
  std::filesystem::remove_all(dir);
}

TEST(PresetTokenizer, CoversThePresetVocabularyWithReadableWords) {
  for (const char* preset : {"tiny", "demo", "mid"}) {
    auto cfg = model::load_preset(preset);
    ASSERT_TRUE(cfg.ok());
    const std::int64_t vocab = cfg.value().text.vocab_size;
    auto json = preset_tokenizer_json(vocab);
    ASSERT_TRUE(json.ok()) << json.error().message;
    auto t = Tokenizer::from_json(json.value());
    ASSERT_TRUE(t.ok()) << preset << ": " << t.error().message;
    EXPECT_EQ(t.value().vocab_size(), vocab) << preset;
    EXPECT_EQ(t.value().piece(106), "<turn|>");
    EXPECT_EQ(t.value().piece(107), "\n");
    EXPECT_EQ(t.value().piece(2), "<bos>");
    // Every id has a piece, and words decode to words.
    for (std::int64_t id = 0; id < vocab; ++id) {
      ASSERT_FALSE(t.value().piece(id).empty()) << preset << " id " << id;
    }
    const std::string s = "the cat sat on a mat.";
    EXPECT_EQ(t.value().decode(encode(t.value(), s)), s) << preset;
    EXPECT_EQ(preset_tokenizer_json(vocab).value(), json.value()) << "deterministic";
  }
  // demo has room for whole words: at least a thousand "▁word" pieces of 4+ letters.
  auto demo = Tokenizer::from_json(preset_tokenizer_json(4096).value()).value();
  int words = 0;
  for (std::int64_t id = 0; id < demo.vocab_size(); ++id) {
    const std::string p = demo.piece(id);
    words += p.rfind(kSp, 0) == 0 && p.size() >= kSp.size() + 4 ? 1 : 0;
  }
  EXPECT_GE(words, 1000);
  EXPECT_FALSE(preset_tokenizer_json(100).ok());
}

// The typed path (no JSON) builds the tokenizer the JSON text describes: the same piece at
// every id, the same special marks, the same ids for text with words, bytes and specials
// (26B-A4B's 262,144 pieces included: the path exists for them, issue #37).
TEST(PresetTokenizer, TheTypedSpecBuildsWhatItsJsonDescribes) {
  const std::string text =
      "<|turn>user\nThe cat sat on a mat; it's 42 \xC3\xA9t\xC3\xA9s!\n\n<turn|>\xF0\x9F\x90\x88";
  // The released model's 262,144 pieces run the same code as 4,096, 64 times over: 4.5 s here,
  // over 4 minutes under AddressSanitizer (the longest test of CI's sanitizer step), which
  // therefore stops at 4,096.
  std::vector<std::int64_t> sizes{512, 4096};
  if constexpr (!::batchlens::testing::kAddressSanitizer) {
    sizes.push_back(262144);
  }
  for (const std::int64_t vocab : sizes) {
    auto from_json = Tokenizer::from_json(preset_tokenizer_json(vocab).value());
    auto typed = preset_tokenizer(vocab);
    ASSERT_TRUE(from_json.ok()) << from_json.error().message;
    ASSERT_TRUE(typed.ok()) << typed.error().message;
    const Tokenizer& a = from_json.value();
    const Tokenizer& b = typed.value();
    ASSERT_EQ(a.vocab_size(), b.vocab_size()) << vocab;
    for (std::int64_t id = 0; id < a.vocab_size(); ++id) {
      ASSERT_EQ(a.piece(id), b.piece(id)) << vocab << " id " << id;
      ASSERT_EQ(a.is_special(id), b.is_special(id)) << vocab << " id " << id;
    }
    const auto ids = encode(a, text);
    EXPECT_EQ(encode(b, text), ids) << vocab;
    EXPECT_EQ(b.decode(ids), a.decode(ids)) << vocab;
  }
  EXPECT_FALSE(preset_tokenizer(100).ok());
}

// What from_spec refuses, as from_json does for the same content.
TEST(PresetTokenizer, ABadSpecIsRefusedWithItsReason) {
  BpeTokenizerSpec spec;
  spec.vocab = {{"a", 0}, {"b", 1}, {"ab", 2}};
  spec.merges = {{"a", "b"}};
  ASSERT_TRUE(Tokenizer::from_spec(spec).ok());
  BpeTokenizerSpec unknown = spec;
  unknown.merges.emplace_back("b", "c");
  auto e = Tokenizer::from_spec(unknown);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("names a piece that is not in the vocabulary"),
            std::string::npos)
      << e.error().message;
  BpeTokenizerSpec twice = spec;
  twice.vocab.emplace_back("a", 5);
  e = Tokenizer::from_spec(twice);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("has two ids"), std::string::npos) << e.error().message;
  BpeTokenizerSpec empty_added = spec;
  empty_added.added.push_back({3, "", false, false, true});
  EXPECT_FALSE(Tokenizer::from_spec(empty_added).ok());
  BpeTokenizerSpec bad_unk = spec;
  bad_unk.unk_token = "<unk>";
  EXPECT_FALSE(Tokenizer::from_spec(bad_unk).ok());
  BpeTokenizerSpec bad_pipeline = spec;
  bad_pipeline.normalizer = "{\"type\": \"NoSuchNormalizer\"}";
  e = Tokenizer::from_spec(bad_pipeline);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code, base::ErrorCode::FileUnrecognised) << e.error().message;
  EXPECT_FALSE(Tokenizer::from_spec(BpeTokenizerSpec{}).ok()) << "an empty vocabulary";
}

}  // namespace
}  // namespace batchlens::text
