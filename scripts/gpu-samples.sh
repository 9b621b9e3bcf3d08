#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GUI's bundled GPU samples, recorded again in one device call with kernel provenance on
# (issue #33: their Kernels tab must show which kernels ran at B=1 and B=N without a GPU):
#   demo-trained-TAG-free.h5   the bundled trained model, free mode, B=1, repeat, 2, 3, 4 and the
#                              issue's workaround (default kernels)
#   mid-TAG-free.h5            `mid`, free, as resources/samples/ has it (six taps)
#   26ba4b-TAG-lockstep.h5     the 26B-A4B architecture, lockstep, B=2, 4 (four taps)
# TAG is h200 or h100, the GPU that recorded them.
# Each leaves NAME.h5, NAME.txt (summary, with the command and its wall time) and NAME.json in
# $OUT. Run ON the GPU machine from the repository root (.deps/ from
# scripts/gpu-prepare-deps.sh carried): scripts/gpu-samples.sh. Then, here, copy the .h5 files
# over resources/samples/ (the names are the bundled ones) and run the ui tests.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/out}
build=${BUILD_DIR:-/tmp/batchlens-gpu}
mkdir -p "$out"
OUT="$out" scripts/gpu-build.sh --cli "$build" || exit 1
record() {  # NAME [batchlens-cli run options...]
  local name=$1
  shift
  SKIP_BUILD=1 BUILD_DIR="$build" OUT="$out" scripts/gpu-experiment.sh "$name" "$@" \
    2>>"$out/samples.log"
  echo "gpu-samples: $name rc=$?" | tee -a "$out/samples.log"
}
# Named by the GPU that recorded them (the device tool gives an H100 or an H200).
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
  *H200*) tag=h200 ;;
  *H100*) tag=h100 ;;
  *) tag=gpu ;;
esac
record demo-trained-$tag-free --preset demo-trained --mode free --workaround issue_workaround \
  --prompt "In the beginning God created the heaven and the earth."
record mid-$tag-free --preset mid --mode free --workaround issue_workaround \
  --taps selfcond.soft_embed,router.scores,router.topk_ids,moe.out,layer.out,logits
record 26ba4b-$tag-lockstep --preset 26b-a4b --mode lockstep --workaround issue_workaround \
  --batch-sizes 2,4 --taps selfcond.soft_embed,router.scores,router.topk_ids,logits
ls -l "$out"
