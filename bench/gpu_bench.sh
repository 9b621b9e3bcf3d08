#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# BatchLens vs the transformers 5.17 reference on the H200, same weights, inputs and machine
# (issue #7). Run ON the GPU machine from the repository root (.deps/ carried):
#   bench/gpu_bench.sh [PRESET...]        (default: 26b-a4b mid)
# Per preset it
#   1. writes the seeded random checkpoint + inputs and times the reference's decoder forward at
#      B = 1 and 4 (tools/parity/make_reference.py --time);
#   2. runs BatchLens's forward on the same inputs (self-conditioning on, every tap; the fused
#      kernels where they passed their check) and compares every tensor bitwise with the
#      reference (tools/parity/compare.py), writes the kernel profile of that pass
#      (kernels-PRESET-b1.md, bench/kernel_table.py), and in the same process
#      times the decoder forward at B = 1: the straight eager port, eager without host syncs, and
#      a CUDA graph replay (checked bitwise against eager), each without and with the fused
#      kernels (checked bitwise against the unfused pass); then the same timings at B = 4, and at
#      B = 4 with the issue_workaround policy;
#   3. times one full 48-step canvas: the reference's generate (bench/reference_canvas_time.py)
#      and BatchLens's experiment engines (batchlens-cli run, taps none: B = 1 repeat and B = 4);
#   4. measures capture overhead: the same experiment with every tap compared on every step
#      (each configuration twice, alternating; the report takes the faster of each).
# Then (ROWWISE_MIN=1, default) it checks whether row-wise selfcond_matmul alone makes B = 2, 3,
# 4 bitwise identical to B = 1 for the preset (random preset weights, taps as the findings).
# Leaves the logs and JSON in $OUT; bench/gpu_bench_report.py turns them into the tables of
# docs/benchmarks.md ($OUT/benchmarks-h200.md).
# Environment: BUILD_DIR (/tmp/batchlens-gpu), WORK (/tmp/blbench), REPS (20 mid, 10 26B),
# DEADLINE_S (560): later steps are skipped past it; CAPTURE_ONLY=1: only step 4, on the
# presets' random weights and default prompt (no reference, no checkpoint), each configuration
# CAPTURE_RUNS times (2), alternating.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1
t0=$(date +%s)
deadline=${DEADLINE_S:-560}
out=${OUT:-$PWD/out}
build=${BUILD_DIR:-/tmp/batchlens-gpu}
work=${WORK:-/tmp/blbench}
mkdir -p "$out" "$work"
scripts/gpu-build.sh --cli "$build" >"$out/bench-build.log" 2>&1 || { tail -30 "$out/bench-build.log"; exit 1; }
cli="$build/app/batchlens-cli"
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(26b-a4b mid)
left() { echo $(( deadline - ($(date +%s) - t0) )); }
step() {  # LOG COMMAND...: runs it under the deadline, output to $out/LOG
  local log=$1
  shift
  local budget
  budget=$(left)
  if [ "$budget" -lt 20 ]; then
    echo "bench: skipped $log (deadline)" | tee -a "$out/bench.log"
    return 1
  fi
  echo "bench: $log ($(( $(date +%s) - t0 )) s in): $*" >>"$out/bench.log"
  timeout "$budget" "$@" >"$out/$log" 2>&1
  local rc=$?
  echo "bench: $log rc=$rc ($(( $(date +%s) - t0 )) s in)" | tee -a "$out/bench.log"
  return $rc
}
experiment() {  # NAME run-options...: batchlens-cli run + summary JSON with the process wall
  local name=$1
  shift
  local start
  start=$(date +%s.%N)
  step "$name.txt" "$cli" run --device cuda --dtype bf16 --experts grouped_mm "$@" \
    --out "$work/$name.h5" || return 1
  "$cli" summary --json "$work/$name.h5" >"$out/$name.json"
  python3 - "$out/$name.json" "$start" <<'PY'
import json, sys, time
p = sys.argv[1]
d = json.load(open(p))
d["process_wall_s"] = time.time() - float(sys.argv[2])
json.dump(d, open(p, "w"), indent=1)
PY
}

if [ "${CAPTURE_ONLY:-0}" = 1 ]; then
  # Only step 4, on the preset's random weights (built on the device, no checkpoint to write)
  # and its default prompt: the capture overhead without the reference's 47 GiB checkpoint.
  for preset in "${presets[@]}"; do
    canvas=$(python3 -c "import json;print(json.load(open('resources/models/$preset.json'))['canvas_length'])")
    run=(--preset "$preset" --max-new-tokens "$canvas" --steps 48 --batch-sizes 4 --repeats 1)
    for r in "" $(seq -f -r%g 2 "${CAPTURE_RUNS:-2}"); do
      experiment "canvas-$preset-taps_none-wa_none$r" "${run[@]}" --taps none
      experiment "canvas-$preset-taps_all-wa_none$r" "${run[@]}"
    done
  done
  python3 bench/gpu_bench_report.py "$out" >"$out/benchmarks-h200.md" 2>>"$out/bench.log"
  echo "bench: done in $(( $(date +%s) - t0 )) s" | tee -a "$out/bench.log"
  exit 0
fi

for preset in "${presets[@]}"; do
  w="$work/$preset"
  rm -rf "${work:?}"/*  # the 26B checkpoint is 47 GiB; one at a time
  reps=${REPS:-$([ "$preset" = mid ] && echo 20 || echo 10)}
  step "reference-$preset.log" python3 tools/parity/make_reference.py \
    --config "resources/models/$preset.json" --out "$w" --time || continue
  cp "$w/reference_timing.json" "$out/reference-timing-$preset.json"
  fwd=("$cli" forward --checkpoint "$w" --inputs "$w/inputs_sc.safetensors" --device cuda
       --dtype bf16 --experts grouped_mm --repeat "$reps" --cuda-graph)
  step "forward-$preset-b1.txt" "${fwd[@]}" --rows 1 --taps all --out "$w/ours_sc.safetensors" \
    --profile "$w/trace-b1.json" &&
    python3 bench/kernel_table.py "$w/trace-b1.json" >"$out/kernels-$preset-b1.md" &&
    step "parity-$preset.md" python3 tools/parity/compare.py "$w/reference_sc.safetensors" \
      "$w/ours_sc.safetensors" --json "$out/parity-$preset.json"
  rm -f "$w/ours_sc.safetensors"
  step "forward-$preset-b4.txt" "${fwd[@]}" --rows 4
  step "forward-$preset-b4-issue_workaround.txt" "${fwd[@]}" --rows 4 --policy issue_workaround
  step "canvas-reference-$preset.txt" python3 bench/reference_canvas_time.py --checkpoint "$w" \
    --reps 2 --json "$out/canvas-reference-$preset.json"
  canvas=$(python3 -c "import json;print(json.load(open('$w/config.json'))['canvas_length'])")
  ids=$(python3 -c "
from safetensors.torch import load_file
print(','.join(str(int(i)) for i in load_file('$w/inputs_nosc.safetensors')['input_ids'][0]))")
  run=(--checkpoint "$w" --prompt-ids "$ids" --max-new-tokens "$canvas" --steps 48
       --batch-sizes 4 --repeats 1)
  # Twice each, alternating: the report takes the faster run of each (machine noise).
  for r in "" -r2; do
    experiment "canvas-$preset-taps_none-wa_none$r" "${run[@]}" --taps none
    experiment "canvas-$preset-taps_all-wa_none$r" "${run[@]}"
  done
  if [ "${ROWWISE_MIN:-1}" = 1 ]; then
    experiment "rowwise-selfcond_matmul-$preset" --preset "$preset" --mode free --repeats 0 \
      --policy '{"name":"row_wise_selfcond_matmul","rules":[{"families":["selfcond_matmul"]}]}' \
      --taps selfcond.soft_embed,router.scores,logits
  fi
done
python3 bench/gpu_bench_report.py "$out" >"$out/benchmarks-h200.md" 2>>"$out/bench.log"
echo "bench: done in $(( $(date +%s) - t0 )) s" | tee -a "$out/bench.log"
