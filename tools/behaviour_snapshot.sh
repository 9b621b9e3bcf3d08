#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Writes what a refactoring must not change into OUT_DIR, with the given batchlens-cli: experiment
# files of the tiny and demo presets (default and emulated split-K policies, free and lockstep
# modes, with and without the issue's workaround), `generate --json` and `forward` outputs, and
# what is built on the runner (issue #31): `summary` text and JSON, a culprit run, a sweep with
# its summary, a minimal repro (wall times and the host masked where they are printed).
# Compare two snapshots with tools/compare_snapshots.py (issue #15: behaviour unchanged, shown).
# Usage: tools/behaviour_snapshot.sh CLI OUT_DIR [--quick]
set -euo pipefail
cli=${1:?usage: tools/behaviour_snapshot.sh CLI OUT_DIR}
out=${2:?usage: tools/behaviour_snapshot.sh CLI OUT_DIR}
mkdir -p "$out"
for preset in tiny demo; do
  for policy in default emulated_split_k; do
    for mode in free lockstep; do
      for wa in none issue_workaround; do
        name="run.$preset.$policy.$mode.$wa.h5"
        args=(run --preset "$preset" --policy "$policy" --mode "$mode" --steps 6
              --max-new-tokens 24 --batch-sizes 2,3 --gen-seed 3 --out "$out/$name")
        [ "$wa" != none ] && args+=(--workaround "$wa")
        echo "--- $name" >&2
        "$cli" "${args[@]}" >/dev/null
      done
    done
  done
  echo "--- run.$preset.shared-batched.h5" >&2
  "$cli" run --preset "$preset" --policy emulated_split_k --rng shared --prefill batched \
    --steps 6 --max-new-tokens 24 --batch-sizes 4 --repeats 2 --taps router.scores,logits \
    --raw --prompt "Hello there" --out "$out/run.$preset.shared-batched.h5" >/dev/null
  "$cli" generate --preset "$preset" --batch 3 --steps 6 --max-new-tokens 24 --gen-seed 5 --json --show-ids \
    --prompt "Write a long essay about Portugal." \
    > "$out/generate.$preset.json"
  "$cli" generate --preset "$preset" --batch 2 --steps 6 --max-new-tokens 24 --gen-seed 5 \
    --rng shared --prefill batched --policy issue_workaround --json --prompt "Hi" \
    > "$out/generate.$preset.shared-batched.json"
  "$cli" forward --preset "$preset" --rows 3 --self-conditioning --taps all \
    --out "$out/forward.$preset.safetensors" >/dev/null
  "$cli" tokenize --preset "$preset" --chat --pieces "Write a long essay about Portugal." \
    > "$out/tokenize.$preset.txt"
  "$cli" save-model --preset "$preset" --seed 2 --out "$out/model.$preset" >/dev/null
done
echo "snapshot in $out" >&2

# Built on the runner: summaries, the culprit finder, a sweep, a repro (core/analysis).
mask() {  # wall times, the build and the snapshot's folder vary between two snapshots
  sed -E 's/[0-9]+\.[0-9]+ s\b/T s/g; s/"(wall_s|wall_time_s|created_utc|seconds|host)": [^,}]*/"\1": X/g
          s/[0-9.]+ \([0-9a-f]{12}\)/VERSION/g; s#'"$out"'#OUT#g'
}
for f in run.tiny.emulated_split_k.lockstep.issue_workaround.h5 run.demo.emulated_split_k.free.issue_workaround.h5; do
  "$cli" summary "$out/$f" | mask >"$out/summary.$f.txt"
  "$cli" summary --json "$out/$f" | mask >"$out/summary.$f.json.txt"
done
"$cli" culprit --preset tiny --policy emulated_h100_report --steps 6 --max-new-tokens 24 \
  --batch-sizes 2,3 --gen-seed 3 --cost-repeats 0 --out "$out/culprit.tiny.h5" | mask \
  >"$out/culprit.tiny.txt"
"$cli" summary --json "$out/culprit.tiny.h5" | mask >"$out/summary.culprit.tiny.json.txt"
printf 'Hello there\nWrite a long essay about Portugal.\n' >"$out/prompts.txt"
"$cli" sweep --preset tiny --policy emulated_split_k --steps 6 --max-new-tokens 24 \
  --batch-sizes 2,3 --workaround issue_workaround --prompts "$out/prompts.txt" --seeds 0-1 \
  --out "$out/sweep.tiny" 2>/dev/null | mask >"$out/sweep.tiny.txt"
"$cli" summary "$out/sweep.tiny/sweep.h5" | mask >"$out/summary.sweep.tiny.txt"
"$cli" summary --json "$out/sweep.tiny/sweep.h5" | mask >"$out/summary.sweep.tiny.json.txt"
rm -rf "$out/sweep.tiny"
"$cli" repro "$out/run.tiny.emulated_split_k.free.none.h5" --out "$out/repro.tiny" >/dev/null
