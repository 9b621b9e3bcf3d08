// SPDX-License-Identifier: Apache-2.0
// Switches that change how BatchLens computes, never what it computes: the fused CUDA kernels and
// CUDA graphs give bitwise the same results and can be turned off to bisect or to measure each.
// Read from the environment once, at the program's edge (the CLI's options, the GUI's main);
// carried in model::LoadOptions to where they act; recorded in experiment provenance.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace batchlens::base {

struct Switches {
  bool fused = true;  ///< BATCHLENS_FUSED=0: no fused kernel at all
  std::vector<std::string>
      fused_off;            ///< BATCHLENS_FUSED_OFF=norm,combine,gelu,softcap,route,diff,gemm
  bool cuda_graphs = true;  ///< BATCHLENS_CUDA_GRAPHS=0: denoising steps run eagerly
  /// BATCHLENS_THREAD_CHOICE=0: a CPU model keeps LibTorch's threads (no measurement at load,
  /// setup/cpu_threads.h)
  bool thread_choice = true;
  /// BATCHLENS_BI_PLAN=fixed: the batch-invariant CUDA GEMM takes cuBLASLt's first single-pass
  /// proposal at 1024 rows and the K split of K alone (the plan before 2026-12-06) instead of
  /// timing the candidates at several row counts (kernels/invariant_gemm_cuda.cpp). Either plan
  /// is batch invariant; they differ in speed and, in batch-invariant mode, in the bits.
  bool bi_plan_timed = true;

  /// Whether the fused kernel `name` may run (it is then still checked bitwise on the device).
  bool fused_kernel(std::string_view name) const;
  /// "" at the defaults, else what is set in the environment's words, e.g.
  /// "BATCHLENS_FUSED_OFF=diff,norm; BATCHLENS_CUDA_GRAPHS=0".
  std::string describe() const;

  /// BATCHLENS_FUSED, BATCHLENS_FUSED_OFF (comma-separated), BATCHLENS_CUDA_GRAPHS,
  /// BATCHLENS_THREAD_CHOICE and BATCHLENS_BI_PLAN, read now.
  /// Call it where the program starts or takes its options, never deep inside a run.
  static Switches from_environment();
};

}  // namespace batchlens::base
