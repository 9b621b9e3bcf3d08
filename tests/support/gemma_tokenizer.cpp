// SPDX-License-Identifier: Apache-2.0
#include "tests/support/gemma_tokenizer.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "core/text/tokenizer_builder.h"

namespace batchlens::testing {

std::string gemma_fixture_tokenizer_json() {
  text::TokenizerBuilder b;
  const auto& specials = text::gemma_special_tokens();
  for (const auto& [id, content] : specials) {
    b.add_special(id, content);
  }
  // Shortest first: a piece's prefixes must not have taken its id already.
  const std::vector<std::pair<const char*, std::int64_t>> pieces = {{"\n", 107},
                                                                    {".", 236761},
                                                                    {"\xE2\x96\x81"
                                                                     "a",
                                                                     496},
                                                                    {"user", 2364},
                                                                    {"model", 4368},
                                                                    {"Write", 6974},
                                                                    {"system", 9731},
                                                                    {"thought", 45518},
                                                                    {"\xE2\x96\x81"
                                                                     "long",
                                                                     1440},
                                                                    {"\xE2\x96\x81"
                                                                     "about",
                                                                     1003},
                                                                    {"\xE2\x96\x81"
                                                                     "essay",
                                                                     20494},
                                                                    {"\xE2\x96\x81"
                                                                     "Portugal",
                                                                     23613}};
  for (const auto& [piece, id] : pieces) {
    b.add_piece(piece, id);
  }
  for (char c : std::string("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ,!?")) {
    b.add_piece(c == ' ' ? "\xE2\x96\x81" : std::string(1, c));
  }
  b.add_byte_fallback();
  return b.to_json();
}

}  // namespace batchlens::testing
