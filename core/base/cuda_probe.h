// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "core/base/system_info.h"

namespace batchlens::base::detail {

/// Fills the CUDA fields of `info` (driver, runtime, cuBLAS, GPUs). Implemented in
/// cuda_probe_cuda.cpp when LibTorch has CUDA and in cuda_probe_none.cpp otherwise; the
/// build picks one (CMake variable BATCHLENS_WITH_CUDA). May throw c10::Error.
void probe_cuda(SystemInfo& info);

}  // namespace batchlens::base::detail
