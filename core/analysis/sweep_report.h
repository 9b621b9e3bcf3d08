// SPDX-License-Identifier: Apache-2.0
// A sweep's report: the table `batchlens-cli summary` prints for a sweep, and its JSON.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/analysis/sweep_records.h"

namespace batchlens::analysis {

/// The table `batchlens-cli summary` prints for a sweep, and its JSON.
std::string sweep_text(const SweepRecords& s);
nlohmann::json sweep_json(const SweepRecords& s);

}  // namespace batchlens::analysis
