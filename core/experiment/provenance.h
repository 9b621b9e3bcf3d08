// SPDX-License-Identifier: Apache-2.0
// Where and with what an experiment ran: tool version and git hash, host, device and its driver,
// LibTorch, BLAS, threads. (The switches in force are the spec's: ExperimentSpec::load.)
// Torch-free.
#pragma once

#include <string>

#include "core/experiment/experiment.h"
#include "core/model/loader.h"

namespace batchlens::experiment {

/// The provenance of a run now, on `load`'s device with its dtype; `emulated` when
/// some run used the emulated split-K kernel.
Provenance provenance_now(const model::LoadOptions& load, bool emulated);

/// The current UTC time as "2026-12-03T16:27:33Z".
std::string utc_now();

}  // namespace batchlens::experiment
