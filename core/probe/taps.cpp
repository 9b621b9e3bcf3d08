// SPDX-License-Identifier: Apache-2.0
#include "core/probe/taps.h"

#include <ATen/ATen.h>

namespace batchlens::probe {

void TapRecorder::record(Tap tap, int layer, const at::Tensor& value) {
  recorded_[{tap, layer}] = value.detach().clone();
}

at::Tensor TapRecorder::get(Tap tap, int layer) const {
  const auto it = recorded_.find({tap, layer});
  return it == recorded_.end() ? at::Tensor() : it->second;
}

}  // namespace batchlens::probe
