// SPDX-License-Identifier: Apache-2.0
// Which op families feed each tap of DiffusionGemma: model knowledge that the culprit finder,
// kernel evidence, minimal repros and sweeps share.
#pragma once

#include <string>

#include "core/ops/policy.h"

namespace batchlens::model {

/// The op families behind a tap: the ops whose output it is or directly holds (e.g. mlp.out:
/// the dense MLP's gate, up and down). Empty for "tokens" and unknown taps.
ops::FamilySet families_behind(const std::string& tap);

}  // namespace batchlens::model
