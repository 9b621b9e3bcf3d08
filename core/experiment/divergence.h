// SPDX-License-Identifier: Apache-2.0
// Where a comparison first differs: the first tick, and in it the first op in model order, at
// which any element's bits differ. Torch-free.
#pragma once

#include <string>
#include <vector>

#include "core/experiment/experiment.h"
#include "core/experiment/plan.h"

namespace batchlens::experiment {

/// The first (tick, slot, tap, position) of `c` that differs, scanning each compared tick in
/// model order: self-conditioning taps, then the layers in order, then the logits; then the
/// sampler's decisions. `names` label the T axis; `ref` (the reference run) gives the canvas and
/// step of the tick. Not found (tick -1) when the two agree bit for bit.
Divergence first_divergence(const ComparisonResult& c, const Layout& lay,
                            const std::vector<std::string>& names, const RunResult& ref);

}  // namespace batchlens::experiment
