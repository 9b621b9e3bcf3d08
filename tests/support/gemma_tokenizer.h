// SPDX-License-Identifier: Apache-2.0
// A tokenizer.json fixture with Gemma's ids for the pieces of the spec's chat-template example.
#pragma once

#include <string>

namespace batchlens::testing {

/// Gemma's special tokens at Gemma's ids, "\n" at 107, the chat words (user 2364, model 4368,
/// system 9731, thought 45518), the pieces of "Write a long essay about Portugal." at the ids
/// the HF integration test lists, letters and punctuation, and byte fallback. Built with
/// text::TokenizerBuilder, so encoding depends only on BatchLens's own code.
std::string gemma_fixture_tokenizer_json();

}  // namespace batchlens::testing
