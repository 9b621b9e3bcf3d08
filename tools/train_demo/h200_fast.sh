#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# --fast's GPU measurement and training run, in one device call (issue #33):
#   1. bench: steps/s, tokens/s, FLOPs and memory of the port's step, eager and as CUDA graphs,
#      at BENCH_BATCHES (default 256,1024), BENCH_STEPS timed steps each;
#   2. train: the --fast run (CUDA graphs) of STEPS steps (default 10000, warm-up 3 %),
#      resumable, stopped after TRAIN_SECONDS (default 300).
# Everything lands in $OUT as it is written (run.log, bench.jsonl, log.jsonl, state.pt).
# The call (device tool): bash tools/train_demo/h200_fast.sh   with carry [".train_demo"]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=$root/.train_demo
out=${OUT:-$root/out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
train() { python3 "$here/train.py" "$@" --work "$work"; }
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__)'
  train bench --device cuda --bench-batches "${BENCH_BATCHES:-256,1024}" \
    --bench-steps "${BENCH_STEPS:-100}"
  cp "$work/bench.jsonl" "$out/"
  if [ "${TRAIN_SECONDS:-300}" -gt 0 ]; then
    train train --backend port --fast --device cuda --steps "${STEPS:-10000}" \
      --warmup-share 0.03 --eval-every 500 --save-every 2000 --log-every 100 \
      --batch "${BATCH:-256}" --max-seconds "${TRAIN_SECONDS:-300}"
    cp "$work/log.jsonl" "$out/"
  fi
} 2>&1 | grep --line-buffered -v "UserWarning\|warnings.warn" | tee "$out/run.log"
