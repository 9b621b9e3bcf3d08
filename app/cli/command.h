// SPDX-License-Identifier: Apache-2.0
// The commands of batchlens-cli: exit codes, the helpers every command shares (mode and policy
// arguments, the version text) and one register_* function per command (cmd_<name>.cpp).
#pragma once

#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "core/ops/policy.h"

namespace batchlens::cli {

/// Process exit codes of batchlens-cli (`batchlens-cli --help` lists them; README).
constexpr int kExitOk = 0;            ///< success
constexpr int kExitFailure = 1;       ///< the command ran and failed (bad file, out of memory, ...)
constexpr int kExitUsage = 2;         ///< bad command line
constexpr int kExitCancelled = 130;   ///< interrupted by Ctrl-C; no partial output left behind
constexpr int kExitTerminated = 143;  ///< SIGTERM (e.g. a scheduler's time limit); likewise

/// The --help footer that lists the exit codes above.
constexpr const char* kExitCodesHelp =
    "Exit codes: 0 done; 1 the command failed (a damaged file, out of memory, a write that\n"
    "failed: `run` then saves its result to batchlens-rescued-*.h5 in $TMPDIR, /tmp or $HOME\n"
    "and says where); 2 a bad command line or input refused before any work (bad --out,\n"
    "text that is not UTF-8); 130 Ctrl-C; 143 SIGTERM. A file is either written complete or\n"
    "not at all: an interrupted write leaves neither the file nor a temporary.";

/// The --help footer's list of the environment's switches (base::Switches): how BatchLens
/// computes, never what, except the batch-invariant plan, which the experiment file records.
constexpr const char* kEnvironmentHelp =
    "Environment (read at start; an experiment file keeps what was set):\n"
    "  BATCHLENS_CUDA_GRAPHS=0     denoising steps run eagerly (saves GPU memory)\n"
    "  BATCHLENS_FUSED=0           no fused CUDA kernel (each is bitwise ATen's chain)\n"
    "  BATCHLENS_FUSED_OFF=LIST    these fused kernels off: "
    "norm,normvec,mean,onepass,combine,gelu,softcap,route,router,\n"
    "                              quads,probs,experts,qbranch,mlpbranch,diff,gemm,room (quads:\n"
    "                              combine, gelu and softcap one element per thread; probs: the\n"
    "                              self-conditioning softmax as ATen runs it; router: the\n"
    "                              router's softmax and top-k as ATen runs them; experts: the\n"
    "                              experts' GEMMs by torch._grouped_mm; room: the decoder\n"
    "                              concatenates the cache)\n"
    "  BATCHLENS_THREAD_CHOICE=0   a CPU model keeps LibTorch's threads (no measurement at load)\n"
    "  BATCHLENS_SIDE_BRANCHES=1   CUDA: a layer's independent parts on a second stream (same\n"
    "                              bits; measured slower on an H100, so off by default)\n"
    "  BATCHLENS_EXPERT_WGMMA=1    CUDA 9.0: the load check also tries the experts' GEMM with\n"
    "                              wgmma where mma.sync lacks torch's bits (used only where every\n"
    "                              bit matched; off until a GPU has run it)\n"
    "  BATCHLENS_BI_PLAN=PLAN      the batch-invariant CUDA GEMM's algorithms: classes (default:\n"
    "                              a bitwise class, its fastest member per M), timed (one\n"
    "                              algorithm per shape), fixed (cuBLASLt's first at 1024 rows);\n"
    "                              each is batch invariant, each gives that mode other bits\n"
    "  BATCHLENS_TRACE=FILE        run, culprit: the computation under LibTorch's profiler, a\n"
    "                              Chrome trace in FILE (CUDA builds, with --no-kernels; not\n"
    "                              kept in the file); tools/trace_summary.py sums it up";

/// Parses a mode option's text with `parse` into `out`; on an unknown name prints
/// "batchlens-cli COMMAND: <reason>", sets `exit_code` to kExitUsage and returns false.
template <class T, class Parse>
bool parse_mode(const std::string& text, Parse parse, T& out, const char* command, int& exit_code) {
  auto parsed = parse(text);
  if (!parsed.ok()) {
    std::cerr << "batchlens-cli " << command << ": " << parsed.error().message << "\n";
    exit_code = kExitUsage;
    return false;
  }
  out = parsed.value();
  return true;
}

/// Resolves a --policy or --workaround argument (a named policy, names joined with +, inline
/// JSON or a policy JSON file: ops::policy_from_argument) into `out`; on an error reports it
/// and returns false with kExitUsage (refused before any work).
bool resolve_policy(const std::string& text, ops::OpPolicy& out, int& exit_code);

/// The text `batchlens-cli --version` prints: BatchLens version and build, LibTorch version,
/// CPU threads and CUDA devices.
std::string version_text();

/// Registers `batchlens-cli forward` (prefill + one decoder pass to a safetensors file).
void register_forward(CLI::App& app, int& exit_code);

/// Registers `batchlens-cli cost` (decoder forward time per policy and batch size).
void register_cost(CLI::App& app, int& exit_code);

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

/// `sweep`: an experiment over prompts x seeds, resumable (core/experiment/sweep.h).
void register_sweep(CLI::App& app, int& exit_code);

/// `sweep-merge`: shard files of one sweep into one sweep file (core/io/sweep_file.h).
void register_sweep_merge(CLI::App& app, int& exit_code);
/// remote TARGET probe|run|fetch: runs on a GPU server over SSH (issue #36).
void register_remote(CLI::App& app, int& exit_code);

/// `repro`: a minimal repro folder for one op of an experiment (core/experiment/repro.h).
void register_repro(CLI::App& app, int& exit_code);
/// `culprit`: the culprit finder (core/experiment/culprit.h) on run's spec options.
void register_culprit(CLI::App& app, int& exit_code);

/// `tokenize`: encode text or decode ids with a model's tokenizer; export a preset's.
void register_tokenize(CLI::App& app, int& exit_code);

}  // namespace batchlens::cli
