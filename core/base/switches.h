// SPDX-License-Identifier: Apache-2.0
// Switches that change how BatchLens computes, never what it computes: the fused CUDA kernels and
// CUDA graphs give bitwise the same results and can be turned off to bisect or to measure each.
// Read from the environment once, at the program's edge (the CLI's options, the GUI's main);
// carried in model::LoadOptions to where they act; recorded in experiment provenance.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/base/error.h"

namespace batchlens::base {

/// How the batch-invariant CUDA GEMM picks each shape's cuBLASLt algorithm
/// (kernels/invariant_gemm_cuda.cpp). Every plan is batch invariant; they differ in speed and, in
/// batch-invariant mode, in the bits.
enum class BiPlan {
  /// The default since 2026-12-07: the candidates are timed at several row counts and grouped
  /// by their bits (algorithms whose outputs are bitwise equal at every timed row count); the
  /// group with the smallest worst ratio to the fastest is kept, and each call runs the group's
  /// fastest member at the nearest timed row count: another kernel per M, the same bits.
  Classes,
  /// One algorithm per shape, timed at several row counts (the default of 2026-12-06).
  Timed,
  /// cuBLASLt's first single-pass proposal at 1024 rows (the plan before 2026-12-06).
  Fixed,
};
/// "classes", "timed", "fixed".
const char* bi_plan_name(BiPlan plan);
/// The plan of a name of bi_plan_name; InvalidArgument naming the three for any other text.
Result<BiPlan> parse_bi_plan(std::string_view name);

struct Switches {
  bool fused = true;  ///< BATCHLENS_FUSED=0: no fused kernel at all
  std::vector<std::string>
      fused_off;  ///< BATCHLENS_FUSED_OFF=norm,normvec,mean,onepass,combine,gelu,softcap,route,
                  ///< router,quads,probs,experts,qbranch,mlpbranch,diff,gemm,room
  bool cuda_graphs = true;  ///< BATCHLENS_CUDA_GRAPHS=0: denoising steps run eagerly
  /// BATCHLENS_THREAD_CHOICE=0: a CPU model keeps LibTorch's threads (no measurement at load,
  /// setup/cpu_threads.h)
  bool thread_choice = true;
  /// BATCHLENS_BI_PLAN=timed|fixed (BiPlan): how the batch-invariant CUDA GEMM picks its
  /// algorithms; default BiPlan::Classes.
  BiPlan bi_plan = BiPlan::Classes;
  /// BATCHLENS_SIDE_BRANCHES=1: a layer's independent parts on a second CUDA stream (Q beside
  /// K/V, the dense MLP beside the routing; model::FusedKernels). Off by default: on an H100 the
  /// first form was slower. The same bits either way, so experiment files do not record it.
  bool side_branches = false;
  /// BATCHLENS_EXPERT_WGMMA=1: the load check also tries the experts' GEMM with wgmma
  /// (kernels/expert_gemm_wgmma.cu) where neither mma.sync fold has torch's bits. Off until a
  /// device has run that kernel (issue #37); used only where every bit matched, so experiment
  /// files do not record it.
  bool expert_wgmma = false;

  /// Whether the fused kernel `name` may run (it is then still checked bitwise on the device).
  bool fused_kernel(std::string_view name) const;
  /// Whether the encoder leaves room after its cache for the decoder's keys (model::KvRoom;
  /// BATCHLENS_FUSED_OFF=room: the decoder concatenates the cache with its keys in every pass,
  /// as transformers does). The same bits either way; on with BATCHLENS_FUSED=0 too.
  bool kv_room() const;
  /// "" at the defaults, else what is set in the environment's words, e.g.
  /// "BATCHLENS_FUSED_OFF=diff,norm; BATCHLENS_CUDA_GRAPHS=0".
  std::string describe() const;

  /// BATCHLENS_FUSED, BATCHLENS_FUSED_OFF (comma-separated), BATCHLENS_CUDA_GRAPHS,
  /// BATCHLENS_THREAD_CHOICE, BATCHLENS_BI_PLAN, BATCHLENS_SIDE_BRANCHES and
  /// BATCHLENS_EXPERT_WGMMA, read now.
  /// Call it where the program starts or takes its options, never deep inside a run.
  static Switches from_environment();
};

}  // namespace batchlens::base
