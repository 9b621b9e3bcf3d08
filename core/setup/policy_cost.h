// SPDX-License-Identifier: Apache-2.0
// What a fix costs, measured once for everyone: the decoder forward as the engine runs it, per
// policy and batch size, on one loaded model. `batchlens-cli cost`, the culprit finder and the
// GUI's culprit run all use it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/base/error.h"
#include "core/ops/policy.h"

namespace batchlens::model {
class DiffusionGemma;
}

namespace batchlens::setup {

/// What a fix costs: the decoder forward as the engine runs it (setup/engine_pass.h,
/// self-conditioning on, seeded random inputs, identical rows) for every policy at every batch
/// size, on one loaded model. At each batch size the policies' passes are interleaved (A B A B
/// ..., the order rotated every round) so that a change of machine load falls on all of them.
struct PolicyCostRequest {
  std::vector<std::pair<std::string, ops::OpPolicy>> policies;  ///< label and policy
  std::vector<std::int64_t> batch_sizes{1, 2, 4, 8, 16, 32};
  int repeat = 20;  ///< timed passes per cell (median and quartiles kept)
  std::int64_t prompt_length = 20;
  std::uint64_t input_seed = 0;
  /// Also profile one eager pass per cell (where LibTorch can see device kernels): where the
  /// time goes, per op family and, outside the op layer, per kind of kernel (PassProfile).
  bool profile = false;
  /// Called after each cell with (cells done, cells in all); returns false to stop (Cancelled).
  std::function<bool(int, int)> progress;
};

/// Device time of a group of kernels in one profiled pass.
struct KernelGroup {
  std::string name;       ///< an op family ("router_proj") or a kind of kernel outside the op layer
  bool op_layer = false;  ///< an op family (its calls marked by the op layer)
  int kernels = 0;        ///< launches
  double total_us = 0.0;  ///< sum of their device durations
};

/// One decoder pass profiled eagerly (the same kernels the CUDA graph replays, launched one by
/// one): every kernel's device time, grouped. The graph's replay time minus `kernel_ms` is what
/// the GPU spent between kernels.
struct PassProfile {
  std::vector<KernelGroup> groups;  ///< op families first (enum order), then the other kinds
  double kernel_ms = 0.0;           ///< sum over every kernel
  /// The kernels outside the op layer that took the most time, by name (shortened; op_layer
  /// false), longest first.
  std::vector<KernelGroup> top_outside;
  int op_calls = 0;  ///< distinct op calls (family, layer) the op layer made
  /// Of them, those with no kernel in the trace: > 0 means the profiler dropped records, and
  /// every sum is a lower bound.
  int ops_without_kernels = 0;
  bool complete() const { return ops_without_kernels == 0; }
};

/// The kind of a kernel launched outside the op layer, from its name: "RMSNorm (+RoPE)",
/// "routing (sort, top-k, gather)", "softmax", ... ("other" when none fits).
std::string kernel_kind(const std::string& kernel_name);

/// A kernel's name without "void ", the common namespaces and its parameter list, its template
/// arguments kept (ATen's elementwise and reduce kernels are one name for every functor):
/// "norm_row_kernel<__nv_bfloat16, true>", "unrolled_elementwise_kernel<direct_copy_kernel_cuda…".
std::string short_kernel_name(std::string name);

struct PolicyCostCell {
  double median_ms = 0.0;
  double min_ms = 0.0;
  double q1_ms = 0.0;  ///< first quartile of the passes
  double q3_ms = 0.0;  ///< third quartile
  /// Its interquartile range overlaps the first policy's at the same batch size: the
  /// difference of the medians is within the noise (always false for the first policy).
  bool within_noise = false;
  std::string mode;     ///< EnginePass::mode
  PassProfile profile;  ///< PolicyCostRequest::profile (empty groups otherwise)
};

struct PolicyCosts {
  std::vector<std::string> labels;
  std::vector<std::string> policies;  ///< ops::policy_text of each
  std::vector<std::int64_t> batch_sizes;
  int repeat = 0;
  std::vector<std::vector<PolicyCostCell>> cells;  ///< [policy][batch size]
  bool cpu = false;                                ///< measured on a CPU: a CPU cost, not a GPU's
  double load_before = -1;  ///< 1-minute load average before the measurement (-1: unknown)
  double load_after = -1;   ///< and after it
  int cores = 0;            ///< hardware threads
  /// The machine had more runnable work than cores while measuring: every number is noisy.
  bool busy() const { return cores > 0 && std::max(load_before, load_after) > cores; }
  /// Policy `p`'s cost at batch size index `i` is not a measured difference: within the noise
  /// of the first policy's, or measured on a busy machine.
  bool noisy(std::size_t p, std::size_t i) const { return busy() || cells[p][i].within_noise; }
  /// DiffusionGemma::batch_invariance().report when a policy uses the batch-invariant strategy.
  std::string invariance_report;
  std::string fused_report;
  /// Why no profile was taken although asked for ("" when taken or not asked).
  std::string profile_note;
};

/// Measures it. Errors as run_forward_file (a batch-invariant family the model could not prove
/// is InvalidArgument), Cancelled from progress. Never throws.
base::Result<PolicyCosts> measure_policy_costs(const model::DiffusionGemma& model,
                                               const PolicyCostRequest& request);

}  // namespace batchlens::setup
