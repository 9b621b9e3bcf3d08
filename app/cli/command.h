// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <CLI/CLI.hpp>

namespace batchlens::cli {

/// Process exit codes of batchlens-cli (docs/cli.md).
constexpr int kExitOk = 0;           ///< success
constexpr int kExitFailure = 1;      ///< the command ran and failed (bad file, out of memory, ...)
constexpr int kExitUsage = 2;        ///< bad command line
constexpr int kExitCancelled = 130;  ///< interrupted by Ctrl-C; no partial output left behind

/// The text `batchlens-cli --version` prints: BatchLens version and build, LibTorch version,
/// CPU threads and CUDA devices.
std::string version_text();

/// Registers `batchlens-cli forward` (prefill + one decoder pass to a safetensors file).
void register_forward(CLI::App& app, int& exit_code);

/// Registers `batchlens-cli save-model` (a preset's random weights as a checkpoint).
void register_save_model(CLI::App& app, int& exit_code);

/// Registers `batchlens-cli generate` (block-diffusion generation, token ids out).
void register_generate(CLI::App& app, int& exit_code);

/// Registers `batchlens-cli info` (the same facts as --version, optionally as JSON).
void register_info(CLI::App& app, int& exit_code);

/// `run`: a paired batch-size experiment to an HDF5 file.
void register_run(CLI::App& app, int& exit_code);

/// `summary FILE`: an experiment file in words or JSON.
void register_summary(CLI::App& app, int& exit_code);

/// `tokenize`: encode text or decode ids with a model's tokenizer; export a preset's.
void register_tokenize(CLI::App& app, int& exit_code);

}  // namespace batchlens::cli
