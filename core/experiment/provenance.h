// SPDX-License-Identifier: Apache-2.0
// Where and with what an experiment ran: tool version and git hash, host, device and its driver,
// LibTorch, BLAS, threads. (The switches in force are the spec's: ExperimentSpec::load.)
// Torch-free.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/base/system_info.h"
#include "core/experiment/experiment.h"
#include "core/model/loader.h"

namespace batchlens::experiment {

/// The provenance of a run now, on `load`'s device with its dtype; `emulated` when
/// some run used the emulated split-K kernel.
Provenance provenance_now(const model::LoadOptions& load, bool emulated);

/// provenance_now for the machine `system` describes, without asking this one: the GUI checks
/// a shown experiment against the machine it holds (base::query_system_info at start).
Provenance provenance_of(const base::SystemInfo& system, const model::LoadOptions& load,
                         bool emulated);

/// What chooses the kernels of a run, and so its bits, where `here` differs from `shown`: runs
/// computed with `here` are not comparable with runs recorded with `shown`. Compared: the
/// device, the dtype and LibTorch; on a GPU its name, the CUDA runtime and cuBLAS; on the CPU
/// the kernels LibTorch uses (provenance.cpu: ATen's capability, oneDNN's ISA, who computes
/// bf16 matmuls; a file before schema 1.3 does not record them, which counts as a difference).
/// Not compared: the host, threads, the tool version and the CPU's raw flags and model name
/// (two CPUs with the same kernel sets compute the same bits), nor the emulation flag (a
/// group's; the runs' policies say what was emulated, see extension_mismatches in runner.h).
/// One phrase per difference, e.g. "LibTorch 2.11.0 there, 1.13.0 here"; empty when they
/// match. Never throws.
std::vector<std::string> provenance_mismatches(const Provenance& shown, const Provenance& here);

/// The current UTC time as "2026-12-03T16:27:33Z".
std::string utc_now();

/// The host, device and versions of a process that computed rows (host, device, device_name,
/// driver, cuda, cublas, libtorch, tool, dtype as JSON).
nlohmann::json provenance_to_json(const Provenance& p);
/// FileCorrupted naming the field. Never throws.
base::Result<Provenance> provenance_from_json(const nlohmann::json& doc);

}  // namespace batchlens::experiment
