// SPDX-License-Identifier: Apache-2.0
// The model-selection options that every command running the model shares (--preset or
// --checkpoint, --seed, --device, --dtype, --experts), and how the CLI reports a core error.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/model/loader.h"

namespace batchlens::cli {

/// The model-selection flags shared by commands that run the model.
struct ModelOptions {
  model::ModelSource source;
  model::LoadOptions load;
  std::string checkpoint;  ///< --checkpoint as typed
};

/// "Shipped model preset: tiny, demo, ... (seeded random weights); ... (trained weights,
/// bundled)", from the presets this binary carries.
std::string preset_help();

/// Adds --preset/--checkpoint, --seed, --device, --dtype and --experts to `cmd`.
void add_model_options(CLI::App* cmd, ModelOptions& options);

/// Parses "1,2,3" into `out`; false (with `out` unspecified) on a bad item, which it names in
/// `bad`.
bool parse_int_list(const std::string& text, std::vector<std::int64_t>& out, std::string& bad);

/// Prints a one-line error for a failed Result to stderr and returns the exit code for it
/// (130 for Cancelled, 1 otherwise).
int report_error(const base::Error& error);

}  // namespace batchlens::cli
