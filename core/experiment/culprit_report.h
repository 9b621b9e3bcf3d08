// SPDX-License-Identifier: Apache-2.0
// The culprit finder's report as a value of the experiment file (/culprit): its JSON both ways
// and its one-line headline. The finder itself is analysis/culprit.h.
#pragma once

#include <nlohmann/json.hpp>

#include "core/base/error.h"
#include "core/experiment/experiment.h"

namespace batchlens::experiment {

nlohmann::json to_json(const CulpritReport& report);
/// Inverse of to_json, for files: InvalidArgument on malformed input. Never throws.
base::Result<CulpritReport> culprit_from_json(const nlohmann::json& doc);

}  // namespace batchlens::experiment
