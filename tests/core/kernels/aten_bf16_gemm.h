// SPDX-License-Identifier: Apache-2.0
// Test support: makes LibTorch compute CPU bf16 matmuls with ATen's own kernel (oneDNN off), as
// it does on a CPU without AVX-512, for the guard's lifetime.
#pragma once

#include <ATen/Context.h>

namespace batchlens::kernels::testing {

class AtenBf16Gemm {
 public:
  AtenBf16Gemm() : was_(at::globalContext().userEnabledMkldnn()) {
    at::globalContext().setUserEnabledMkldnn(false);
  }
  ~AtenBf16Gemm() { at::globalContext().setUserEnabledMkldnn(was_); }
  AtenBf16Gemm(const AtenBf16Gemm&) = delete;
  AtenBf16Gemm& operator=(const AtenBf16Gemm&) = delete;

 private:
  bool was_;
};

}  // namespace batchlens::kernels::testing
