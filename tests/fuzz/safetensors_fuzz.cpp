// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the safetensors header parser and validator (model::SafetensorsFile::open) and
// the zero-copy tensor views of a file it accepts.
#include <cstddef>
#include <cstdint>

#include <ATen/core/Tensor.h>

#include "core/base/error.h"
#include "core/model/safetensors.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace batchlens;
  static const fuzz::InputFile file("model.safetensors");
  std::shared_ptr<const model::SafetensorsFile> st;
  try {
    st = model::SafetensorsFile::open(file.write(data, size));
  } catch (const base::ErrorException&) {
    return 0;  // the documented way open() refuses a file; anything else escaping is a bug
  }
  (void)st->metadata();
  for (const auto& [name, info] : st->tensors()) {
    const at::Tensor t = st->tensor(name);
    // Touch the first and the last byte of the view: an offset the validator let through
    // wrongly reads outside the mapping.
    const auto nbytes = static_cast<std::size_t>(t.numel()) * t.element_size();
    if (nbytes > 0) {
      const auto* bytes = static_cast<const volatile std::uint8_t*>(t.data_ptr());
      (void)bytes[0];
      (void)bytes[nbytes - 1];
    }
    (void)info;
  }
  return 0;
}
