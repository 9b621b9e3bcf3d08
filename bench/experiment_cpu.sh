#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Wall time of the demo paired experiment on this CPU (B=1 reference, one B=1 repeat, B=2, B=4,
# and the same with the issue workaround; 48 denoising steps), with taps + metrics on (all 14
# taps) and off (--taps none: tokens and sampler state only). Prints a Markdown table.
#   bench/experiment_cpu.sh [BUILD_DIR] [POLICY]     (default build/ci, default policy)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/ci}
policy=${2:-default}
cli="$build/app/batchlens-cli"
[ -x "$cli" ] || { echo "experiment_cpu: build first ($cli missing)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "| capture | wall s | file MB |"
echo "|---|---|---|"
for taps in all none; do
  args=(run --preset demo --batch-sizes 2,4 --repeats 1 --workaround issue_workaround
        --policy "$policy" --steps 48 --max-new-tokens 64 --out "$out/$taps.h5")
  [ "$taps" = none ] && args+=(--taps none)
  start=$(date +%s.%N)
  "$cli" "${args[@]}" > "$out/$taps.txt" 2>/dev/null
  end=$(date +%s.%N)
  size=$(stat -c %s "$out/$taps.h5")
  printf '| %s | %.1f | %.2f |\n' "$taps" "$(echo "$end - $start" | bc)" "$(echo "$size / 1048576" | bc -l)"
done
echo
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) threads; $("$cli" --version | head -n1)"
