#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Kernel provenance on the GPU (issue #18). Run ON the GPU machine from the repository root
# (.deps/ carried):  bench/gpu_kernels.sh [PRESET ...]   (default: mid 26b-a4b)
# For each preset: `batchlens-cli run` B=1 vs B=4 (free, default kernels, no repeat) with the
# kernels recorded (the default) and again with --no-kernels, the wall time of each, and
# `summary --kernels` of the first (kernels-PRESET.txt). Everything lands in $OUT/kernels.tgz.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-$PWD/out}
build=${BUILD_DIR:-/tmp/batchlens-gpu}
work=$(mktemp -d)
mkdir -p "$out"
scripts/gpu-build.sh --cli "$build" >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }
cli="$build/app/batchlens-cli"
gpu=(--device cuda --dtype bf16 --experts grouped_mm --batch-sizes 4 --repeats 0)
for p in "${@:-mid 26b-a4b}"; do
  for p1 in $p; do
    for mode in kernels no-kernels; do
      extra=()
      [ "$mode" = no-kernels ] && extra=(--no-kernels)
      start=$EPOCHREALTIME
      "$cli" run --preset "$p1" "${gpu[@]}" "${extra[@]}" --out "$work/$p1-$mode.h5" \
        >"$work/run-$p1-$mode.txt" 2>"$work/run-$p1-$mode.err"
      rc=$?
      echo "kernels: $p1 $mode rc=$rc in $(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}') s" | tee -a "$work/times.txt"
    done
    "$cli" summary --kernels "$work/$p1-kernels.h5" >"$work/kernels-$p1.txt" 2>&1
  done
done
"$cli" --version >"$work/version.txt" 2>&1
rm -f "$work"/*.h5
tar czf "$out/kernels.tgz" -C "$work" .
cat "$work/times.txt"
