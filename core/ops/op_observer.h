// SPDX-License-Identifier: Apache-2.0
// What the op layer tells an observer about each matmul-like call it runs: the kernel
// provenance of issue #18 (which path computed each op family, per layer, at which shape).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include <ATen/core/Tensor.h>

#include "core/ops/op_family.h"
#include "core/ops/policy.h"

namespace batchlens::ops {

/// One op call as the op layer ran it.
struct OpCall {
  OpFamily family = OpFamily::QProj;
  int layer = -1;  ///< -1 for per-step ops
  std::string op;  ///< "linear", "matmul", "sdpa", "grouped_mm"
  Strategy strategy = Strategy::Batched;
  std::int64_t m = 0;      ///< rows of each call (attention: query rows per batch element)
  std::int64_t n = 0;      ///< output columns (attention: key rows)
  std::int64_t k = 0;      ///< reduction length (attention: head dim)
  std::int64_t calls = 1;  ///< row-wise: one per logical row
  std::string dtype;       ///< "bf16", "fp32", ...
  /// What computed it, e.g. "at::linear (oneDNN)", "emulated split-K: 8 K-chunks",
  /// "BatchLens CPU GEMM (ATen's bits)", "cuBLASLt pinned, 16 K-splits".
  std::string path;
};

/// Receives every op call of a forward pass that has one (ForwardContext::observer).
class OpObserver {
 public:
  OpObserver() = default;
  OpObserver(const OpObserver&) = delete;
  OpObserver& operator=(const OpObserver&) = delete;
  OpObserver(OpObserver&&) = delete;
  OpObserver& operator=(OpObserver&&) = delete;
  virtual ~OpObserver() = default;
  virtual void on_op(const OpCall& call) = 0;
  /// True: the op layer also marks each call for the device profiler (a named scope per
  /// family and layer, "bl/<family>/<layer>"), so that kernels map back to ops.
  virtual bool marks() const { return false; }
  /// True: on_inputs hears the tensors of calls at (family, layer) (the minimal repro's
  /// capture, experiment/repro.h). Asked once per call.
  virtual bool wants_inputs(OpFamily family, int layer) const {
    (void)family, (void)layer;
    return false;
  }
  /// A call's operands as the op layer got them (device tensors, views as passed): linear and
  /// matmul {x, w}; grouped_mm {x, w, offs}. Called after on_op, before the op runs.
  virtual void on_inputs(const OpCall& call, std::initializer_list<at::Tensor> inputs) {
    (void)call, (void)inputs;
  }
};

}  // namespace batchlens::ops
