#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One device call for issues #33 and #35 (ON the GPU machine, repository root, .deps/ carried):
#   1. the CLI built (scripts/gpu-build.sh --cli);
#   2. issue #35's parity at B > 1: a padded batch of 4 prompts of different lengths through
#      transformers' generate and BatchLens (tools/parity/run_mixed_parity.sh, `mid`,
#      grouped_mm and eager experts);
#   3. the bundled GPU samples recorded again (scripts/gpu-samples.sh), unless SAMPLES=0.
# Everything lands in one archive, $OUT/gpu.tgz.part-NN (15 MB parts; the device tool brings
# back at most 8 files): here, `cat FILES/gpu.tgz.part-* | tar xz -C DIR`.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-$PWD/out}
work=$(mktemp -d)
build=${BUILD_DIR:-/tmp/batchlens-gpu}
mkdir -p "$out"
t0=$(date +%s)
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  OUT="$work" scripts/gpu-build.sh --cli "$build" >/dev/null || { echo "build failed"; exit 1; }
  echo "built in $(( $(date +%s) - t0 )) s"
  for experts in ${PARITY_EXPERTS:-grouped_mm eager}; do
    BL_CLI="$build/app/batchlens-cli" tools/parity/run_mixed_parity.sh resources/models/mid.json \
      "/tmp/parity-mixed-$experts" "$experts" >/dev/null 2>&1
    echo "mixed parity ($experts): exit $?"
    cp "/tmp/parity-mixed-$experts/generate_parity_report.md" "$work/mixed-parity-$experts.md"
    cp "/tmp/parity-mixed-$experts/generate_parity.json" "$work/mixed-parity-$experts.json"
    grep "GENERATE PARITY\|raw logits\|mixed batch" "$work/mixed-parity-$experts.md"
    echo "  $(( $(date +%s) - t0 )) s"
  done
  if [ "${SAMPLES:-1}" = 1 ]; then
    OUT="$work" BUILD_DIR="$build" scripts/gpu-samples.sh
    grep "gpu-samples:" "$work/samples.log"
  fi
  echo "gpu-parity-samples: $(( $(date +%s) - t0 )) s"
} 2>&1 | tee "$work/run.log"
tar czf - -C "$work" . | split -b 15M -d - "$out/gpu.tgz.part-"
cp "$work/run.log" "$out/"
ls -l "$out"
