// SPDX-License-Identifier: Apache-2.0
// Switching the workaround on for the shown experiment: whether this machine can run its
// workaround group with the experiment's own settings, and what to offer when it cannot (the
// CPU demo with the emulation profile standing for its GPU, or the command for the GPU server).
#pragma once

#include <QString>

#include "core/base/system_info.h"
#include "core/experiment/experiment.h"
#include "core/ops/policy.h"

namespace batchlens::ui {

/// Why this build and machine (`system`) cannot add runs to `result` with its settings (its
/// device, its checkpoint directory, or kernels other than its runs': experiment::
/// extension_mismatches, e.g. another LibTorch or ATen CPU capability), or an empty string when
/// they can. A GPU experiment needs the same GPU model here: a workaround group computed on
/// another GPU would not be comparable.
QString workaroundBlocker(const base::SystemInfo& system,
                          const experiment::ExperimentResult& result);

/// The emulation profile that stands for the GPU `provenance` names (its GPU name contains the
/// profile's, e.g. "NVIDIA H200"), else the default profile (the first); `exact` says which.
const ops::EmulationProfile& profileStandingFor(const experiment::Provenance& provenance,
                                                bool* exact = nullptr);

/// The `batchlens-cli run` command that runs `result`'s experiment with `workaround` on the
/// machine it came from (its exact prompt ids), writing "<stem>-workaround.h5".
QString serverCommand(const experiment::ExperimentResult& result, const ops::OpPolicy& workaround,
                      const QString& stem);

}  // namespace batchlens::ui
