#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Capture overhead of a paired experiment on the GPU (issue #7): the same experiment (B = 1
# reference, B = 1 repeat, B = 4; one 48-step canvas; the preset's seeded random weights) with
# every tap compared on every step vs tokens and sampler state only (--taps none).
# Run ON the GPU machine after scripts/gpu-build.sh --cli:  bench/gpu_capture_overhead.sh [PRESET...]
# Prints one line per preset and leaves capture-PRESET-{none,all}.json in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-$PWD/out}
cli=${BUILD_DIR:-/tmp/batchlens-gpu}/app/batchlens-cli
mkdir -p "$out" /tmp/blcapture
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(mid 26b-a4b)
for preset in "${presets[@]}"; do
  canvas=$(python3 -c "import json;print(json.load(open('resources/models/$preset.json'))['canvas_length'])")
  for taps in none all; do
    args=()
    [ "$taps" = none ] && args=(--taps none)
    start=$(date +%s.%N)
    "$cli" run --preset "$preset" --device cuda --dtype bf16 --experts grouped_mm \
      --max-new-tokens "$canvas" --steps 48 --batch-sizes 4 --repeats 1 "${args[@]}" \
      --out "/tmp/blcapture/$preset-$taps.h5" >"$out/capture-$preset-$taps.txt" 2>&1 || continue
    end=$(date +%s.%N)
    "$cli" summary --json "/tmp/blcapture/$preset-$taps.h5" |
      python3 -c "import json,sys; d=json.load(sys.stdin); d['process_wall_s']=$end-$start; print(json.dumps(d))" \
        >"$out/capture-$preset-$taps.json"
  done
  python3 - "$out" "$preset" <<'PY'
import json, sys
out, p = sys.argv[1], sys.argv[2]
try:
    n, a = (json.load(open(f"{out}/capture-{p}-{t}.json")) for t in ("none", "all"))
except OSError:
    sys.exit(0)
steady = lambda d: sum(r["wall_time_s"] for r in d["runs"] if r["id"] != "ref")
print(f"capture {p}: engines (repeat1 + b4) {steady(n):.2f} s none, {steady(a):.2f} s all "
      f"({(steady(a) / steady(n) - 1) * 100:+.1f} %); process {n['process_wall_s']:.1f} s none, "
      f"{a['process_wall_s']:.1f} s all ({(a['process_wall_s'] / n['process_wall_s'] - 1) * 100:+.1f} %)")
PY
done
