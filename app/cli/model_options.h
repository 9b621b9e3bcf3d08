// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "core/model/loader.h"

namespace batchlens::cli {

/// The model-selection flags shared by commands that run the model.
struct ModelOptions {
  model::ModelSource source;
  model::LoadOptions load;
  std::string checkpoint;  ///< --checkpoint as typed
};

/// Adds --preset/--checkpoint, --seed, --device, --dtype and --experts to `cmd`.
void add_model_options(CLI::App* cmd, ModelOptions& options);

/// Prints a one-line error for a failed Result to stderr and returns the exit code for it
/// (130 for Cancelled, 1 otherwise).
int report_error(const base::Error& error);

}  // namespace batchlens::cli
