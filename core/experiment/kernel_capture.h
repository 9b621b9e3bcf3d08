// SPDX-License-Identifier: Apache-2.0
// Recording kernel provenance (kernel_provenance.h) for an experiment's engines: one prefill and
// one decoder pass per engine, without and with self-conditioning, apart from the runs, the op
// layer observing every call (on CUDA under the profiler).
#pragma once

#include <cstdint>
#include <vector>

#include "core/experiment/experiment.h"
#include "core/experiment/kernel_provenance.h"
#include "core/experiment/plan.h"

namespace batchlens::base {
class CancelToken;
}
namespace batchlens::setup {
struct Session;
}

namespace batchlens::experiment {

/// Captures the provenance of every engine of `groups` (B=1 repeats, which are the reference's
/// engine again, are skipped): per run, one encoder prefill as the spec makes it and one decoder
/// pass over a seeded random canvas, without and with self-conditioning (seeded random logits),
/// the op layer observing every call; on CUDA under the profiler after one warm-up pass. Runs
/// apart from the experiment's engines, so it cannot change their numbers. A mixed batch
/// (companion_ids not empty, spec.composition) is prefilled and positioned as its run is.
/// Throws base::ErrorException (Cancelled, OutOfMemory, InvalidArgument).
KernelProvenance capture_kernels(const setup::Session& session, const ExperimentSpec& spec,
                                 const std::vector<std::int64_t>& prompt_ids,
                                 const std::vector<std::vector<std::int64_t>>& companion_ids,
                                 const std::vector<PlannedGroup>& groups,
                                 const base::CancelToken* cancel);

}  // namespace batchlens::experiment
