// SPDX-License-Identifier: Apache-2.0
// Fuzz target: op policy JSON (ops::policy_from_json) and text (policy_from_text: names, family
// lists, inline JSON, parts joined with +),
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
  // The text form too: names, family lists, inline JSON and parts joined with + (a chain of
  // 20,000 parts overflowed the stack, issue #32). policy_from_text never opens a file
  // (policy_from_argument does).
  const auto by_text = ops::policy_from_text(std::string(fuzz::as_text(data, size)));
  if (by_text.ok()) {
    exercise(by_text.value());
  }
  return 0;
}
