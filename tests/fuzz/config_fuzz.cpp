// SPDX-License-Identifier: Apache-2.0
// Fuzz target: config.json (model::parse_config), then what the loader does with an accepted
// config: validate it, write it back and read that again, query every layer.
#include <cstddef>
#include <cstdint>

#include "core/base/error.h"
#include "core/model/config.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace batchlens;
  const nlohmann::json doc = fuzz::parse_json(data, size);
  if (doc.is_discarded()) {
    return 0;
  }
  const auto parsed = model::parse_config(doc);
  if (!parsed.ok()) {
    return 0;
  }
  const model::ModelConfig& config = parsed.value();
  try {
    model::validate(config);
  } catch (const base::ErrorException&) {
    return 0;  // documented: names the first inconsistent field
  }
  const auto again = model::parse_config(model::to_json(config));
  (void)again.ok();
  for (std::int64_t layer = 0; layer < config.text.num_hidden_layers; ++layer) {
    (void)config.text.layer_head_dim(layer);
    (void)config.text.layer_kv_heads(layer);
    (void)config.text.layer_has_v_proj(layer);
  }
  return 0;
}
