// SPDX-License-Identifier: Apache-2.0
// Built when LibTorch has no CUDA (Debian's libtorch-dev): there is nothing to probe.
#include "core/base/system_info.h"

namespace batchlens::base::detail {

void probe_cuda(SystemInfo& info) {
  info.cuda_build = false;
}

}  // namespace batchlens::base::detail
