#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What each fix costs on the GPU (issue #17), and the proofs behind the batch-invariant one.
# Run ON the GPU machine from the repository root (.deps/ carried):
#   bench/gpu_fix_cost.sh [PRESET]          (default 26b-a4b)
#   1. builds the CLI and the gpu tests and runs the gpu label (the batch-invariance check at
#      the 26B-A4B shapes for B = 1..64, the finder on mid with both strategies);
#   2. the row-wise finder with the prompt encoded as one batch (--prefill batched) on PRESET
#      and mid (culprit-batched-PRESET.txt and .h5);
#   3. `batchlens-cli cost`: decoder forward as the engine runs it (CUDA graph + fused kernels,
#      self-conditioning on) at B = 1, 2, 4, 8, 16, 32 for default, the row-wise minimal set,
#      the issue's row-wise pair, the batch-invariant minimal set and batch-invariant everything,
#      one process, one model load (cost-PRESET.txt and .json);
#   4. the finder with the prompt copied on PRESET, batch-invariant then row-wise
#      (culprit-STRATEGY-PRESET.txt).
# Environment: BUILD_DIR (/tmp/batchlens-gpu), REPS (20), SKIP_TESTS=1, SKIP_COST=1,
# SKIP_CULPRIT=1, BATCHED_PRESETS ("PRESET mid"), COPIED_STRATEGIES ("batch_invariant row_wise"),
# DEADLINE_S (570): later steps are skipped past it.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
t0=$(date +%s)
deadline=${DEADLINE_S:-570}
out=${OUT:-$PWD/out}
build=${BUILD_DIR:-/tmp/batchlens-gpu}
preset=${1:-26b-a4b}
reps=${REPS:-20}
mkdir -p "$out"
left() { echo $(( deadline - ($(date +%s) - t0) )); }
gpu=(--device cuda --dtype bf16 --experts grouped_mm)
if [ "${SKIP_TESTS:-0}" = 1 ]; then
  scripts/gpu-build.sh --cli "$build" >"$out/fix-cost-build.log" 2>&1 || { tail -40 "$out/fix-cost-build.log"; exit 1; }
else
  timeout "$(left)" scripts/gpu-build.sh --gpu-tests "$build" >"$out/fix-cost-build.log" 2>&1 ||
    { grep -E 'error|FAILED|Failed' "$out/fix-cost-build.log" | head -40; }
  grep -E 'tests passed|FAILED|Passed|Failed' "$out/fix-cost-build.log" | tail -20
fi
cli="$build/app/batchlens-cli"
[ -x "$cli" ] || exit 1
echo "fix-cost: build + tests $(( $(date +%s) - t0 )) s"
# The finder (row-wise) with the prompt encoded as one batch (--prefill batched): PRESET, then mid.
if [ "${SKIP_CULPRIT:-0}" != 1 ]; then
  for p in ${BATCHED_PRESETS:-$preset mid}; do
    [ "$(left)" -gt 60 ] || break
    start=$(date +%s)
    timeout "$(left)" "$cli" culprit --preset "$p" "${gpu[@]}" --batch-sizes 2,3,4 --repeats 0 \
      --prefill batched --out "/tmp/culprit-batched-$p.h5" >/dev/null 2>"$out/culprit-batched-$p.err"
    echo "fix-cost: culprit --prefill batched $p rc=$? in $(( $(date +%s) - start )) s"
    "$cli" summary "/tmp/culprit-batched-$p.h5" >"$out/culprit-batched-$p.txt" 2>&1
    cp "/tmp/culprit-batched-$p.h5" "$out/" 2>/dev/null
  done
fi
if [ "${SKIP_COST:-0}" != 1 ] && [ "$(left)" -gt 60 ]; then
  timeout "$(left)" "$cli" cost --preset "$preset" "${gpu[@]}" --repeat "$reps" --json \
    >"$out/cost-$preset.json" 2>"$out/cost-$preset.err"
  echo "fix-cost: cost rc=$? at $(( $(date +%s) - t0 )) s"
  python3 - "$out/cost-$preset.json" <<'PY' | tee "$out/cost-$preset.txt"
import json, sys
d = json.load(open(sys.argv[1]))
rows = d["policies"]
bs = [c["batch_size"] for c in rows[0]["cells"]]
print("| policy | " + " | ".join(f"B={b}" for b in bs) + " |")
print("|---|" + "---|" * len(bs))
for r in rows:
    cells = []
    for c in r["cells"]:
        cell = f"{c['median_ms']:.2f}"
        if r is not rows[0]:
            cell += f" ({100 * c['overhead']:+.1f} %)"
        cells.append(cell)
    print(f"| {r['label']} | " + " | ".join(cells) + " |")
for r in rows:
    print(f"- {r['label']}: {r['cells'][0]['mode']}")
print(d.get("invariance_report", ""))
PY
fi
# The finder with the prompt copied (the experiment's default), per strategy, on PRESET.
if [ "${SKIP_CULPRIT:-0}" != 1 ]; then
  for st in ${COPIED_STRATEGIES:-batch_invariant row_wise}; do
    [ "$(left)" -gt 60 ] || break
    start=$(date +%s)
    timeout "$(left)" "$cli" culprit --preset "$preset" "${gpu[@]}" --batch-sizes 2,3,4 --repeats 0 \
      --strategy "$st" --out "/tmp/culprit-$st-$preset.h5" >/dev/null 2>"$out/culprit-$st-$preset.err"
    echo "fix-cost: culprit --strategy $st rc=$? in $(( $(date +%s) - start )) s"
    "$cli" summary "/tmp/culprit-$st-$preset.h5" >"$out/culprit-$st-$preset.txt" 2>&1
  done
fi
echo "fix-cost: done in $(( $(date +%s) - t0 )) s"
