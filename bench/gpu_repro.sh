#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Minimal repro export on the GPU (issue #18). Run ON the GPU machine from the repository root
# (.deps/ carried):  bench/gpu_repro.sh [PRESET ...]   (default: 26b-a4b)
# For each preset: `batchlens-cli run` B=1 vs B=4 (default kernels, kernel provenance recorded),
# `batchlens-cli repro` of its first divergence twice: with the default 64 MiB cap (operands
# beyond it become seeded random stand-ins) and with a cap that holds the captured inputs; then
# each exported repro.py run on its own with the machine's PyTorch (captured, --random, another
# seed, --batch 8, --strategy row_wise). Text outputs land in $OUT/repro.tgz (no tensors).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-$PWD/out}
build=${BUILD_DIR:-/tmp/batchlens-gpu}
work=$(mktemp -d)
mkdir -p "$out"
scripts/gpu-build.sh --cli "$build" >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }
cli="$build/app/batchlens-cli"
gpu=(--device cuda --dtype bf16 --experts grouped_mm --batch-sizes 4 --repeats 0)
log() { echo "$*" | tee -a "$work/log.txt"; }
timed() {  # timed NAME CMD...: runs CMD, its output in NAME.txt, rc and seconds in log.txt
  local name=$1
  shift
  local start=$EPOCHREALTIME
  "$@" >"$work/$name.txt" 2>&1
  local rc=$?
  log "$name: rc=$rc in $(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}') s"
}
for p in ${@:-26b-a4b}; do
  timed "run-$p" "$cli" run --preset "$p" "${gpu[@]}" --out "$work/$p.h5"
  # A small file of the same experiment (two taps) for the GUI's Kernels tab screenshot.
  timed "run-$p-small" "$cli" run --preset "$p" "${gpu[@]}" --taps selfcond.soft_embed,layer.out \
    --out "$work/$p-small.h5"
  if [ "$(stat -c %s "$work/$p-small.h5" 2>/dev/null || echo 99999999)" -lt 15000000 ]; then
    cp "$work/$p-small.h5" "$out/$p-small.h5"
  fi
  timed "export-$p-cap64" "$cli" repro "$work/$p.h5" --out "$work/$p-repro-cap64"
  timed "export-$p-captured" "$cli" repro "$work/$p.h5" --max-bytes 4GiB --out "$work/$p-repro"
  for d in "$p-repro-cap64" "$p-repro"; do
    (cd "$work/$d" && timed "$d-py-default" python3 repro.py)
    (cd "$work/$d" && timed "$d-py-random" python3 repro.py --random)
    (cd "$work/$d" && timed "$d-py-seed7" python3 repro.py --random --seed 7)
    (cd "$work/$d" && timed "$d-py-batch8" python3 repro.py --batch 8)
    (cd "$work/$d" && timed "$d-py-rowwise" python3 repro.py --strategy row_wise)
    (cd "$work/$d" && timed "$d-py-invariant" python3 repro.py --strategy batch_invariant)
    cp "$work/$d/README.md" "$work/$d.README.md"
    cp "$work/$d/op.json" "$work/$d.op.json"
    ls -l "$work/$d" >"$work/$d.ls.txt"
  done
done
"$cli" --version >"$work/version.txt" 2>&1
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' \
  >"$work/torch.txt" 2>&1
nvidia-smi >"$work/nvidia-smi.txt" 2>&1
find "$work" -maxdepth 1 -type d -name '*repro*' -exec rm -rf {} +
rm -f "$work"/*.h5
tar czf "$out/repro.tgz" -C "$work" .
cat "$work/log.txt"
