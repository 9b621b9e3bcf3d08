// SPDX-License-Identifier: Apache-2.0
// The one place where LibTorch version differences live. BatchLens builds against Debian's
// LibTorch 1.13 (CPU) and PyTorch 2.x's LibTorch (CUDA on GPU servers); code elsewhere calls
// the functions here instead of testing versions itself.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <torch/version.h>

/// True when the LibTorch headers are at least major.minor.
#define BL_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||     \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

/// at::scaled_dot_product_attention with `scale=` (2.1+); 1.13 has only a private variant.
#if __has_include(<ATen/ops/scaled_dot_product_attention.h>) && BL_TORCH_AT_LEAST(2, 1)
#define BL_TORCH_HAS_SDPA 1
#else
#define BL_TORCH_HAS_SDPA 0
#endif

/// SDPA's `enable_gqa` argument (2.5+).
#if BL_TORCH_HAS_SDPA && BL_TORCH_AT_LEAST(2, 5)
#define BL_TORCH_HAS_SDPA_GQA 1
#else
#define BL_TORCH_HAS_SDPA_GQA 0
#endif

/// at::_grouped_mm (2.8+, CUDA sm90+): the `grouped_mm` experts implementation.
#if __has_include(<ATen/ops/_grouped_mm.h>) && BL_TORCH_AT_LEAST(2, 8)
#define BL_TORCH_HAS_GROUPED_MM 1
#else
#define BL_TORCH_HAS_GROUPED_MM 0
#endif

namespace batchlens::compat {

/// "1.13.0" etc.: the LibTorch version these headers belong to.
inline std::string torch_version() {
  return TORCH_VERSION;
}

/// Which attention kernel family compat::sdpa runs on this build.
enum class SdpaBackend {
  Native,  ///< at::scaled_dot_product_attention (LibTorch 2.1+): picks flash/efficient/math
  Math,    ///< BatchLens's own math path, equal to PyTorch's math backend (fp32 accumulation)
};

/// The backend compat::sdpa uses in this build.
SdpaBackend sdpa_backend();

/// Scaled dot-product attention, softmax((q k^T) * scale + mask) v, exactly the call
/// transformers' sdpa_attention_forward makes: at::scaled_dot_product_attention where LibTorch
/// has it (2.1+), else sdpa_math.
/// q [B, Hq, Sq, D], k and v [B, Hkv, Sk, D]. With enable_gqa, Hkv may divide Hq (each kv head
/// serves Hq/Hkv consecutive query heads); without it Hkv must equal Hq (callers repeat_kv).
/// mask: boolean (true = attend) or additive float, broadcastable to [B, Hq, Sq, Sk], or
/// undefined. is_causal: top-left aligned causal mask (tril), only with an undefined mask.
/// Returns [B, Hq, Sq, D] in q's dtype. Throws c10::Error on shape mismatch.
/// ref: transformers integrations/sdpa_attention.py sdpa_attention_forward
at::Tensor sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& mask, double scale, bool is_causal = false,
                bool enable_gqa = false);

/// The same as sdpa(), always through BatchLens's math path: PyTorch's math backend
/// (fp32 for half/bf16 inputs, q and k each scaled by sqrt(scale), softmax, matmul), with its
/// 2.5+ safe softmax: a query the mask leaves no key gets zeros.
at::Tensor sdpa_math(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& mask, double scale, bool is_causal = false,
                     bool enable_gqa = false);

/// Grouped matrix multiply (torch._grouped_mm): x [R, K] with rows grouped by offs (int32 [G],
/// cumulative ends), w [G, K, N]; returns [R, N]. Only where BL_TORCH_HAS_GROUPED_MM; throws
/// base::ErrorException(InvalidArgument) elsewhere.
at::Tensor grouped_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offs);

/// A random generator on `device` (CPU mt19937 or CUDA Philox) seeded with `seed`.
/// Throws base::ErrorException(DeviceUnavailable) for devices without one in this build.
at::Generator make_generator(const at::Device& device, std::uint64_t seed);

/// Expands kv heads [B, Hkv, S, D] to [B, Hkv * n_rep, S, D] (each head repeated n_rep times
/// consecutively). ref: transformers repeat_kv
at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep);

}  // namespace batchlens::compat
