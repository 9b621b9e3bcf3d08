#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# --fast's GPU run in one device call (issue #33), everything in $OUT as it is written:
#   0. check (CHECK_VARIANTS, default every experts/attention pair; empty: none): each kernel
#      pair's loss and gradients against the reference kernels, per parameter (check.jsonl);
#   1. bench: steps/s, tokens/s, model FLOPs and utilisation of the training step per
#      BENCH_VARIANTS kernel variant EXPERTS/ATTENTION[/FUSION] (default grouped/sdpa),
#      each first checked against the reference kernels (loss and gradients);
#   2. train: --fast (CUDA graphs) with the fastest variant that passed its check, STEPS steps
#      (default 10000, warm-up 3 %) or BUDGET_S=auto (a schedule that ends before the deadline),
#      LOSS_POSITIONS (default all), resumable, stopped DEADLINE_S (default 560) seconds after
#      the start less a margin for the export;
#   3. export (bf16, released layout, parity inputs) of the state reached, as
#      demo-trained.tgz.part-NN (15 MB parts), and the log.
# Files: run.log, check.jsonl, bench.jsonl, log.jsonl, demo-trained.tgz.part-*,
# compile-cache-*.bin.gz.part-* (torch.compile's artifacts, gzipped, in parts: see TRAIN_CARRY).
# Here first: /usr/bin/python3 tools/train_demo/train.py prepare   (-> .train_demo/)
# The call (device tool): bash tools/train_demo/h200_fast.sh   with carry [".train_demo"];
# a call again within the machine's warm time resumes from $TRAIN_WORK/state.pt.
# After it: cat FILES/demo-trained.tgz.part-* | tar xz -C .train_demo
set -uo pipefail
t0=$(date +%s)
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# The state lives outside the carried .train_demo (a carried path replaces the machine's copy,
# state.pt with it): a call again on the warm machine resumes.
work=${TRAIN_WORK:-/tmp/train_demo}
out=${OUT:-$root/out}
mkdir -p "$out" "$work"
# TRAIN_CARRY: the carried folder (default .train_demo). The device tool carries at most 64 MiB
# with the tree (56 MB of it tracked), so a carry of the corpus gzipped (1.4 MB instead of 5.7) and
# of torch.compile's artifacts gzipped is what fits:
#   mkdir -p .train_carry && gzip -c .train_demo/kjv.jsonl >.train_carry/kjv.jsonl.gz &&
#   cp .train_demo/tokenizer.json .train_carry/ &&
#   cat FILES/compile-cache-*.bin.gz.part-* >.train_carry/compile-cache-<name>.bin.gz
# (.train_carry is git-ignored), then carry [".train_carry"] and set TRAIN_CARRY=.train_carry.
src=${TRAIN_CARRY:-$root/.train_demo}
for f in kjv.jsonl tokenizer.json; do
  [ -f "$work/$f" ] && continue
  if [ -f "$src/$f" ]; then
    cp "$src/$f" "$work/"
  elif [ -f "$src/$f.gz" ]; then
    gunzip -c "$src/$f.gz" >"$work/$f"
  fi
done
# torch.compile's artifacts of an earlier call (train.py compile_cache_path), as they are or
# gzipped: compiling then took 55 s instead of 76 s on an H100 (docs/benchmarks.md).
cp -n "$src"/compile-cache-*.bin "$work/" 2>/dev/null || true
for f in "$src"/compile-cache-*.bin.gz; do
  [ -f "$f" ] && gunzip -c "$f" >"$work/$(basename "$f" .gz)"
done
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
# BUCKET: the context width of --fast's batches (default 16: 11 CUDA graphs; 32: 6).
train() { python3 "$here/train.py" "$@" --work "$work" --bucket "${BUCKET:-16}"; }
left() { echo $(( ${DEADLINE_S:-560} - ($(date +%s) - t0) )); }
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__)'
  kernels=(--experts "${EXPERTS:-auto}" --attention "${ATTENTION:-auto}" --fusion "${FUSION:-auto}")
  if [ -n "${CHECK_VARIANTS-dense/eager,grouped/eager,dense/sdpa,grouped/sdpa}" ]; then
    train check-kernels --device cuda --batch 64 \
      --bench-variants "${CHECK_VARIANTS-dense/eager,grouped/eager,dense/sdpa,grouped/sdpa}" |
      tee "$out/check.jsonl"
  fi
  if [ "${BENCH_STEPS:-40}" -gt 0 ] && [ ! -f "$work/state.pt" ]; then
    rm -f "$work/bench.jsonl"
    train bench --device cuda --bench-batches "${BENCH_BATCHES:-256}" \
      --bench-variants "${BENCH_VARIANTS:-grouped/sdpa}" \
      --bench-modes "${BENCH_MODES:-graphs}" --bench-steps "${BENCH_STEPS:-40}"
    cp "$work/bench.jsonl" "$out/"
    # The fastest variant whose loss and gradients match the reference kernels'.
    best=$(python3 - "$work/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ok = [r for r in rows if "error" not in r and r.get("check_grad_cos", 0) > 0.99
      and r.get("check_loss_rel", 1) < 0.02]
best = max(ok, key=lambda r: r["steps_per_s"], default=None)
print("%s %s %s" % (best["experts"], best["attention"], best.get("fusion", "none"))
      if best else "dense eager none")
PY
)
    read -r b_experts b_attention b_fusion <<< "$best"
    echo "h200_fast: training with experts $b_experts, attention $b_attention, fusion $b_fusion"
    [ "${EXPERTS:-auto}" = auto ] &&
      kernels=(--experts "$b_experts" --attention "$b_attention" --fusion "$b_fusion")
  fi
  # BUDGET_S=auto: a schedule measured to end before the deadline (steps 10-40 timed; the
  # held-out evaluations and the export's margin left out), else STEPS steps.
  if [ "${BUDGET_S:-}" = auto ]; then
    length=(--budget-seconds "$(( $(left) - ${EXPORT_MARGIN_S:-40} - ${EVAL_MARGIN_S:-30} ))")
  else
    length=(--steps "${STEPS:-10000}")
  fi
  train train --backend port --fast --device cuda "${kernels[@]}" "${length[@]}" \
    --warmup-share 0.03 --eval-every "${EVAL_EVERY:-500}" --save-every 1000 --log-every 100 \
    --loss-positions "${LOSS_POSITIONS:-all}" \
    --batch "${BATCH:-256}" --max-seconds "$(( $(left) - ${EXPORT_MARGIN_S:-40} ))"
  cp "$work/log.jsonl" "$out/"
  # Here after the call: cat FILES/compile-cache-*.bin.gz.part-* into the carry (see above).
  for f in "$work"/compile-cache-*.bin; do
    [ -f "$f" ] && gzip -c "$f" | split -b 15M -d - "$out/$(basename "$f").gz.part-"
  done
  done=$(python3 -c '
import json, sys
last = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][-1]
print(int(last["step"] >= last["total"]))' "$work/log.jsonl")
  # The export of whatever state there is (a model part-way through its schedule says so in
  # log.jsonl); a call again on the warm machine resumes the schedule.
  [ "$done" = 1 ] || echo "h200_fast: the schedule is not done: call again within the warm time to resume"
  train export --backend port &&
    tar czf - -C "$work" demo-trained | split -b 15M -d - "$out/demo-trained.tgz.part-"
  echo "h200_fast: $(( $(date +%s) - t0 )) s"
} 2>&1 | grep --line-buffered -v "UserWarning\|warnings.warn" | tee "$out/run.log"
