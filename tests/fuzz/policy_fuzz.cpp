// SPDX-License-Identifier: Apache-2.0
// Fuzz target: op policy JSON (ops::policy_from_json, and policy_from_text),
// then what runs do with an accepted policy: resolve every family in a few layers, describe it,
// combine it with the workaround.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/ops/op_family.h"
#include "core/ops/policy.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

void exercise(const batchlens::ops::OpPolicy& policy) {
  using namespace batchlens::ops;
  for (const OpFamily family : all_families()) {
    for (const int layer : {0, 1, 7, 1000}) {
      (void)policy.resolve(family, layer);
    }
    (void)policy.emulates(family);
  }
  (void)describe(policy);
  (void)to_json(policy).dump();
  (void)describe(combine(policy, OpPolicy::issue_workaround()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace batchlens;
  const nlohmann::json doc = fuzz::parse_json(data, size);
  if (!doc.is_discarded()) {
    const auto parsed = ops::policy_from_json(doc);
    if (parsed.ok()) {
      exercise(parsed.value());
    }
  }
  // Inline JSON only: any other text names policies or a file, and the fuzzer must not make the
  // reader open arbitrary paths.
  const auto text = fuzz::as_text(data, size);
  if (!text.empty() && text.front() == '{') {
    const auto by_name = ops::policy_from_text(std::string(text));
    if (by_name.ok()) {
      exercise(by_name.value());
    }
  }
  return 0;
}
