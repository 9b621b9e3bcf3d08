// SPDX-License-Identifier: Apache-2.0
// Fuzz target: tokenizer.json (text::Tokenizer::from_json), then a short encode and decode with
// whatever tokenizer it accepted.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/text/tokenizer.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace batchlens;
  const auto parsed = text::Tokenizer::from_json(fuzz::as_text(data, size));
  if (!parsed.ok()) {
    return 0;
  }
  const text::Tokenizer& tok = parsed.value();
  // Added tokens, spaces, newlines, bytes without a piece (byte fallback) and multi-byte UTF-8.
  static constexpr const char* kSamples[] = {
      "<start_of_turn>user\nWrite a long essay about Portugal.<end_of_turn>\n",
      "  tab\there \xe2\x96\x81 caf\xc3\xa9 \xf0\x9f\x98\x80 \x01\x7f",
      "",
  };
  for (const char* sample : kSamples) {
    const auto ids = tok.encode(sample);
    if (ids.ok()) {
      (void)tok.decode(ids.value());
      (void)tok.decode(ids.value(), /*skip_special=*/true);
    }
  }
  std::vector<std::int64_t> ids{-1, 0, tok.vocab_size(), tok.vocab_size() - 1};
  for (std::int64_t id = 0; id < tok.vocab_size() && id < 64; ++id) {
    ids.push_back(id);
    (void)tok.piece(id);
    (void)tok.is_special(id);
  }
  (void)tok.decode(ids);
  (void)tok.token_id("<pad>");
  return 0;
}
