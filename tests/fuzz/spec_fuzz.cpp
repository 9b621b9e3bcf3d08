// SPDX-License-Identifier: Apache-2.0
// Fuzz target: experiment spec JSON (experiment::spec_from_json, as stored in experiment files
// and sent by the GUI), then validate() and the way back to JSON.
#include <cstddef>
#include <cstdint>

#include "core/experiment/experiment.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace batchlens;
  const nlohmann::json doc = fuzz::parse_json(data, size);
  if (doc.is_discarded()) {
    return 0;
  }
  const auto parsed = experiment::spec_from_json(doc);
  if (!parsed.ok()) {
    return 0;
  }
  (void)experiment::validate(parsed.value()).ok();
  const nlohmann::json back = experiment::to_json(parsed.value());
  (void)experiment::spec_from_json(back).ok();
  return 0;
}
