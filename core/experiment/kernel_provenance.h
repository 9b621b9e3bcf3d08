// SPDX-License-Identifier: Apache-2.0
// Kernel provenance (issue #18), the values: which kernels each op family launched, per layer,
// in one uncaptured decoder pass per engine of an experiment, with and without
// self-conditioning; their JSON (the file's /kernels) and how two ops' kernels differ.
// Recording them is kernel_capture.h; the lines a summary prints, analysis/kernel_evidence.h.
// On CUDA the kernels come from the profiler (Kineto, as LibTorch ships it), mapped to ops
// through the op layer's marks; on a CPU the path the op layer took (oneDNN / ATen /
// BatchLens's CPU GEMM / the emulated kernel) is the record.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/base/error.h"

namespace batchlens::experiment {

/// Launches of one device kernel by one op, identical ones counted together.
struct KernelLaunch {
  std::string name;  ///< as the GPU library reports it (demangled where the profiler does)
  std::array<std::int64_t, 3> grid{0, 0, 0};
  std::array<std::int64_t, 3> block{0, 0, 0};
  int calls = 0;
  double total_us = 0.0;  ///< device time of all its launches in the pass
};

/// What computed one op family at one layer in one engine's decoder pass.
struct OpKernels {
  std::string family;  ///< ops::family_name
  int layer = -1;      ///< -1 for per-step ops
  std::string op;      ///< "linear", "matmul", "sdpa", "grouped_mm"
  std::string strategy;
  std::int64_t m = 0;  ///< rows per call (see ops::OpCall)
  std::int64_t n = 0;
  std::int64_t k = 0;
  std::int64_t calls = 0;  ///< op calls in the pass (row-wise: B per op; eager experts: per expert)
  std::string dtype;
  /// The op layer's path, e.g. "at::linear → oneDNN", "emulated split-K: 8 K-chunks",
  /// "cuBLASLt pinned algorithm, 16 K-split(s)"; several joined by " | " when calls differed.
  std::string path;
  std::vector<KernelLaunch> kernels;  ///< CUDA only, in first-launch order
};

/// One engine's decoder pass.
struct EngineKernels {
  std::string run;  ///< the run id ("ref", "b4", "wa.b2", ...)
  int batch_size = 1;
  std::string policy;  ///< ops::policy_text
  bool self_conditioning = false;
  std::string device;
  double seconds = 0.0;  ///< the capture's wall time (warm-up, pass, trace)
  std::vector<OpKernels> ops;
};

/// Every engine's passes, stored at /kernels of the experiment file (schema 1.5).
struct KernelProvenance {
  std::string source;  ///< "profiler (Kineto)" on CUDA, "op layer paths" on a CPU
  std::vector<EngineKernels> engines;
  double wall_s = 0.0;

  /// The pass of `run` with or without self-conditioning, or null.
  const EngineKernels* engine(const std::string& run, bool self_conditioning) const;
};

nlohmann::json to_json(const KernelProvenance& k);
/// FileCorrupted naming the field when `doc` is not a provenance record (types, sizes: at most
/// 4096 engines, 100000 ops each, 4096 kernels per op, strings of 4096 characters). Never throws.
base::Result<KernelProvenance> kernels_from_json(const nlohmann::json& doc);

/// The op of `engine` at (family, layer), or null.
const OpKernels* find_op(const EngineKernels& engine, const std::string& family, int layer);

/// "at::linear → cuBLAS: sm90_xmma_gemm_… grid [2,16,1] block [128,1,1]" (kernels joined by
/// "; "), or the path alone where no kernels were recorded.
std::string describe(const OpKernels& op);

/// What differs between the op at B=1 (`a`) and at B (`b`): each a short phrase, e.g. "path:
/// emulated split-K: 8 K-chunks → 2 K-chunks", "kernel: … → …", "tile 64x64 → 128x128",
/// "split-K: no → yes (a reduction kernel follows)", "grid [2,16,1] → [8,16,1]". Empty when the
/// same kernels ran with the same launch shapes.
std::vector<std::string> kernel_differences(const OpKernels& a, const OpKernels& b);

}  // namespace batchlens::experiment
