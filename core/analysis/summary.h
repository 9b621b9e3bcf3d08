// SPDX-License-Identifier: Apache-2.0
// An experiment's summary: the text `batchlens-cli summary` prints (provenance, headline, the
// culprit finder's trials and costs, runs, comparisons with their kernel evidence, the noise
// floor) and its JSON form (the schema's summarised fields plus the same evidence).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/experiment/experiment.h"

namespace batchlens::analysis {

/// Human summary (what `batchlens-cli summary` prints).
std::string summary_text(const experiment::ExperimentResult& result);
/// Its JSON form (`batchlens-cli summary --json`, the report's summary.json).
nlohmann::json summary_json(const experiment::ExperimentResult& result);

}  // namespace batchlens::analysis
