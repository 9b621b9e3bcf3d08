#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The demo model's GPU run, in one device call of under 10 minutes (the device tool's limit):
#   1. our BPE encoder == Hugging Face `tokenizers` on the corpus;
#   2. the smoke run with transformers' own class on the CPU (API, export, reload), and the
#      plain-PyTorch port (what CI trains) against transformers' logits on its weights;
#   3. the training run (TRAIN_SECONDS, default 400 s of training; resumable: run it again
#      on the same machine and it continues from .train_demo/state.pt);
#   4. export (bf16, released layout), the port checked again on the trained weights, samples
#      at B=1 through transformers' generate, the loss curve.
# Everything that comes back lands in $OUT (at most 8 files of 16 MiB): run.log, log.jsonl,
# loss.png, samples-transformers.json and the export as demo-trained.tgz.part-NN.
#
# Here, before the call: /usr/bin/python3 tools/train_demo/train.py prepare  (-> .train_demo/)
# The call (device tool): bash tools/train_demo/h200.sh   with carry [".train_demo"]
# After it: cat $FILES/demo-trained.tgz.part-* | tar xz -C .train_demo
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=$root/.train_demo
out=${OUT:-$root/out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
train() { python3 "$here/train.py" "$@"; }
{
  set -x
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, transformers, tokenizers; print("torch", torch.__version__,
"transformers", transformers.__version__, "tokenizers", tokenizers.__version__)'
  train check-tokenizer --work "$work"

  smoke=$work/smoke
  mkdir -p "$smoke"
  cp "$work/kjv.jsonl" "$work/tokenizer.json" "$smoke/"
  train train --smoke --backend transformers --device cpu --fresh --work "$smoke"
  train export --smoke --backend transformers --work "$smoke"
  train check-port --work "$smoke"

  train train --backend transformers --device cuda --work "$work" \
    --budget-seconds "${TRAIN_SECONDS:-400}" --max-seconds "$((${TRAIN_SECONDS:-400} + 40))"
  train export --backend transformers --work "$work"
  # What matters most comes back first, in case the call runs out of time after it.
  tar czf - -C "$work" --exclude parity demo-trained |
    split -b 15M -d - "$out/demo-trained.tgz.part-"
  cp "$work/log.jsonl" "$out/"
  train plot --work "$work" --device-name "an NVIDIA H200" && cp "$work/loss.png" "$out/"
  train check-port --work "$work"
  train samples --device cuda --work "$work" --eos-prompts "${EOS_PROMPTS:-24}"
  cp "$work/samples-transformers.json" "$out/"
} 2>&1 | grep --line-buffered -v "UserWarning\|warnings.warn" | tee "$out/run.log"
ls -la "$out"
