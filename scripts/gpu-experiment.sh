#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One-command paired batch-size experiment on a GPU server: builds core + CLI (incremental
# when BUILD_DIR already holds a build), runs `batchlens-cli run` on CUDA with the user's
# setting (bf16, sdpa attention, grouped_mm experts; TF32 stays off, LibTorch's default) and
# leaves the experiment file, its text summary and its JSON summary in $OUT (the device tool
# brings $OUT back) or ./out. Provenance in the file is read from the device it ran on.
#
# Usage (repository root, on the GPU machine; .deps/ from scripts/gpu-prepare-deps.sh):
#   scripts/gpu-experiment.sh NAME [batchlens-cli run options...]
# e.g.
#   scripts/gpu-experiment.sh mid-h200-free --preset mid --mode free --workaround issue_workaround
# writes $OUT/NAME.h5, $OUT/NAME.txt (summary) and $OUT/NAME.json (summary --json).
# Environment: BUILD_DIR (default /tmp/batchlens-gpu), NO_FILE=1 keeps the .h5 under
# BUILD_DIR/files instead of $OUT (for experiments too large to bring back).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n 2,16p "$0"; exit 2; }
name=$1
shift
build=${BUILD_DIR:-/tmp/batchlens-gpu}
out=${OUT:-$PWD/out}
mkdir -p "$out"
if [ ! -x "$build/app/batchlens-cli" ] || [ -z "${SKIP_BUILD:-}" ]; then
  OUT="$out" scripts/gpu-build.sh --cli "$build" >&2
fi
file="$out/$name.h5"
if [ -n "${NO_FILE:-}" ]; then
  mkdir -p "$build/files"
  file="$build/files/$name.h5"
fi
cli="$build/app/batchlens-cli"
start=$(date +%s)
"$cli" run --device cuda --dtype bf16 --experts grouped_mm "$@" --out "$file" >"$out/$name.txt"
echo "command: batchlens-cli run --device cuda --dtype bf16 --experts grouped_mm $* (wall $(( $(date +%s) - start )) s)" >>"$out/$name.txt"
"$cli" summary --json "$file" >"$out/$name.json"
ls -l "$file" >&2
