// SPDX-License-Identifier: Apache-2.0
// Fuzz target: generation_config.json (generation::parse_generation_config), then the accepted
// config written back, read again and overridden.
#include <cstddef>
#include <cstdint>

#include "core/generation/generation_config.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace batchlens;
  const auto parsed = generation::parse_generation_config(fuzz::as_text(data, size));
  if (!parsed.ok()) {
    return 0;
  }
  const auto& config = parsed.value();
  (void)generation::validate(config).ok();
  (void)generation::parse_generation_config(generation::to_json(config)).ok();
  generation::GenerationOverrides overrides;
  overrides.max_denoising_steps = 1;
  overrides.max_new_tokens = 1;
  (void)generation::apply(overrides, config).ok();
  return 0;
}
