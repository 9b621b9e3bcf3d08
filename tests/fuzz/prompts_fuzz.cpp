// SPDX-License-Identifier: Apache-2.0
// Fuzz target: a prompt file (batchlens-cli sweep --prompts: plain lines or JSON Lines),
// setup::read_prompts, then the prompts as a sweep spec (validate, id, JSON) (issue #32).
#include <cstddef>
#include <cstdint>

#include "core/analysis/sweep_spec.h"
#include "core/base/input.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace batchlens;
  static const fuzz::InputFile file("prompts.txt");
  const auto prompts = setup::read_prompts(file.write(data, size));
  if (!prompts.ok()) {
    return 0;
  }
  analysis::SweepSpec spec;
  spec.base.model.preset = "tiny";
  spec.base.batch_sizes = {2};
  spec.prompts = prompts.value();
  spec.seeds = {0};
  if (analysis::validate(spec).ok()) {
    (void)analysis::sweep_id(spec);
    (void)base::dump_json_lossy(analysis::to_json(spec));
  }
  return 0;
}
