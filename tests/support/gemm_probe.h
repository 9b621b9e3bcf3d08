// SPDX-License-Identifier: Apache-2.0
// What this CPU's own bf16 products do when more rows come along: tests about "the CPU's default
// kernels are batch-invariant" hold on some CPUs and not others, so they measure it first.
#pragma once

#include <string>

namespace batchlens::test {

/// Why this CPU's bf16 products give row block 0 other bits in a batch than alone, at a shape of
/// the `preset` model (the first such product, its shapes and row counts, and this CPU's AMX
/// flag); empty when none of the probed products does. Measured once per preset: LibTorch's
/// own kernels at M = C alone and with 1-3 more row blocks (and small expert-sized M), for the
/// projections (x @ W^T) and the self-conditioning matmul (probs [M, V] @ E [V, H]). Seen: on
/// CPUs with AMX (amx_bf16, oneDNN avx512_core_amx) the self-conditioning matmul changes at
/// M = 3C and 4C; on AVX-512 without AMX nothing changes.
std::string bf16_products_depend_on_rows(const std::string& preset = "demo");

}  // namespace batchlens::test
