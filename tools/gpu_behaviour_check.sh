#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Run ON the GPU server: shows that a refactoring left GPU results bitwise unchanged. Builds the
# working tree (core, CLI, gpu tests; runs the gpu label) and an older source tree (CLI only),
# then runs the same `mid` experiments with both CLIs on CUDA and writes the files to OUT_DIR as
# before/ and after/: compare them here with tools/compare_snapshots.py (dataset by dataset, bit
# for bit). Needs .deps/ (scripts/gpu-prepare-deps.sh) in both trees or the working tree's.
# Usage: tools/gpu_behaviour_check.sh OLD_SOURCE_DIR OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?usage: tools/gpu_behaviour_check.sh OLD_SOURCE_DIR OUT_DIR}
out=${2:?usage: tools/gpu_behaviour_check.sh OLD_SOURCE_DIR OUT_DIR}
mkdir -p "$out/before" "$out/after" "$out/logs"
[ -d "$old/.deps" ] || ln -s "$PWD/.deps" "$old/.deps"
OUT="$out/logs/after" scripts/gpu-build.sh --gpu-tests /tmp/bl-after
OUT="$out/logs/before" "$old/scripts/gpu-build.sh" --cli /tmp/bl-before
experiments() {
  local cli=$1 dir=$2
  "$cli" run --preset mid --device cuda --steps 8 --max-new-tokens 64 --batch-sizes 2,4 \
    --gen-seed 7 --workaround issue_workaround --out "$dir/run.mid.free.h5" >"$dir/run.mid.free.txt"
  "$cli" run --preset mid --device cuda --steps 6 --max-new-tokens 32 --batch-sizes 3 \
    --mode lockstep --rng shared --prefill batched --out "$dir/run.mid.lockstep.h5" \
    >"$dir/run.mid.lockstep.txt"
  "$cli" generate --preset mid --device cuda --batch 4 --steps 8 --max-new-tokens 64 \
    --gen-seed 5 --json --show-ids --prompt "Write a long essay about Portugal." \
    >"$dir/generate.mid.json"
}
experiments /tmp/bl-after/app/batchlens-cli "$out/after"
experiments /tmp/bl-before/app/batchlens-cli "$out/before"
# The human summaries print timings; only the files are compared.
rm -f "$out"/before/*.txt "$out"/after/*.txt
echo "gpu_behaviour_check: wrote $out/before and $out/after"
