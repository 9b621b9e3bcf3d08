#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The issue-#19 sweep on the GPU machine. Run ON it from the repository root (.deps/ carried):
#   bench/gpu_sweep.sh [PRESET] [SHARDS] [ONLY]  (defaults: 26b-a4b, one shard per GPU, all)
# ONLY: the shard indexes this call runs, e.g. "0" or "1 3" (one machine, several calls).
# 24 prompts (resources/prompts/sweep-24.txt) x seed 0, B = 2, 3, 4, default kernels and the
# issue's workaround, free mode: each shard runs on its own GPU (CUDA_VISIBLE_DEVICES) into its
# shard file, as Slurm array tasks would; then sweep-merge. A shard stopped by the time limit
# (BL_SWEEP_SECONDS, default 480) resumes when the script runs again on the same folder
# ($SWEEP_DIR). Results: $OUT/sweep-PRESET.h5 (merged), $OUT/sweep.tgz (logs, summaries, timings).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
preset=${1:-26b-a4b}
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
shards=${2:-$(( gpus > 0 ? gpus : 1 ))}
out=${OUT:-$PWD/out}
build=${BUILD_DIR:-/tmp/batchlens-gpu}
dir=${SWEEP_DIR:-$PWD/gpu-sweep-$preset}
work=$(mktemp -d)
mkdir -p "$out" "$dir"
scripts/gpu-build.sh --cli "$build" >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }
cli="$build/app/batchlens-cli"
args=(--preset "$preset" --device cuda --dtype bf16 --experts grouped_mm --batch-sizes 2,3,4
  --workaround issue_workaround --mode free --prompts resources/prompts/sweep-24.txt --seeds 0
  --out "$dir")
start=$EPOCHREALTIME
pids=()
only=${3:-$(seq 0 $(( shards - 1 )))}
for i in $only; do
  CUDA_VISIBLE_DEVICES=$(( i % (gpus > 0 ? gpus : 1) )) timeout -s TERM "${BL_SWEEP_SECONDS:-480}" \
    "$cli" sweep "${args[@]}" --shard "$i/$shards" >"$work/shard-$i.txt" 2>"$work/shard-$i.err" &
  pids+=($!)
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  echo "shard $(echo $only | cut -d' ' -f$(( i + 1 )))/$shards: rc=$? after $(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}') s" \
    | tee -a "$work/log.txt"
done
"$cli" sweep-merge "$dir"/shards/shard-*-of-"$shards".h5 --out "$out/sweep-$preset.h5" \
  >"$work/merge.txt" 2>&1
echo "merge: rc=$?" | tee -a "$work/log.txt"
"$cli" summary "$dir" >"$work/summary-folder.txt" 2>&1
"$cli" summary --json "$out/sweep-$preset.h5" >"$work/summary.json" 2>&1
"$cli" --version >"$work/version.txt" 2>&1
nvidia-smi >"$work/nvidia-smi.txt" 2>&1
tar czf "$out/sweep-$(echo $only | tr ' ' '-').tgz" -C "$work" . -C "$dir" sweep.json items shards
cat "$work/merge.txt" "$work/log.txt"
