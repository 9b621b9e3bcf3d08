#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Parity of `batchlens-cli forward` against transformers' DiffusionGemma, on the GPU machine.
#
#   tools/parity/run_parity.sh PRESET_JSON WORKDIR [EXPERTS]
#
# Run from the repository root after the C++ build. It writes a seeded random checkpoint, inputs
# and reference outputs into WORKDIR (make_reference.py), runs the C++ forward on the same
# checkpoint and inputs without and with self-conditioning, and compares tensor by tensor
# (compare.py). Everything printed is also written to WORKDIR/parity_report.md.
#
# EXPERTS: grouped_mm (default) or eager; used by both sides.
# Environment:
#   BL_CLI    the C++ CLI (default /tmp/batchlens-gpu/app/batchlens-cli)
#   PYTHON    python with torch + transformers 5.17 + safetensors (default python3)
#   REF_ARGS  extra make_reference.py arguments, e.g. "--batch 4 --time" or "--no-save-weights"
#   POLICY    batchlens-cli --policy (default "default")
# Exit status: 0 when every step ran (whatever the parity verdict), 1 when a step failed.
set -euo pipefail
export PYTHONUNBUFFERED=1

if [[ $# -lt 2 || $# -gt 3 ]]; then
  echo "usage: $0 PRESET_JSON WORKDIR [grouped_mm|eager]" >&2
  exit 2
fi
PRESET=$1
WORKDIR=$2
EXPERTS=${3:-grouped_mm}
case "$EXPERTS" in
  grouped_mm | eager) ;;
  *)
    echo "run_parity: EXPERTS must be grouped_mm or eager, got '$EXPERTS'" >&2
    exit 2
    ;;
esac
BL_CLI=${BL_CLI:-/tmp/batchlens-gpu/app/batchlens-cli}
PYTHON=${PYTHON:-python3}
POLICY=${POLICY:-default}
read -r -a REF_EXTRA <<<"${REF_ARGS:-}"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [[ ! -f "$PRESET" ]]; then
  echo "run_parity: preset '$PRESET' not found" >&2
  exit 2
fi
if [[ ! -x "$BL_CLI" ]]; then
  echo "run_parity: '$BL_CLI' is not an executable; build first or set BL_CLI" >&2
  exit 2
fi
mkdir -p "$WORKDIR"
REPORT="$WORKDIR/parity_report.md"

main() {
  set -e
  local status=0
  echo "# BatchLens parity report"
  echo
  echo "- preset: \`$PRESET\`, workdir: \`$WORKDIR\`, experts: \`$EXPERTS\`, policy: \`$POLICY\`"
  echo "- make_reference args: \`${REF_ARGS:-}\`"
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ), host: $(hostname)"
  echo "- repo: $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (modified)')"
  echo "- gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1 || echo '?')"
  echo "- disk free in workdir: $(df -h --output=avail "$WORKDIR" 2>/dev/null | tail -n1 | tr -d ' ' || echo '?')"
  echo

  echo "## 1. Reference (transformers)"
  echo
  echo '```'
  if ! "$PYTHON" "$HERE/make_reference.py" --config "$PRESET" --out "$WORKDIR" --experts "$EXPERTS" \
    ${REF_EXTRA[@]+"${REF_EXTRA[@]}"}; then
    echo '```'
    echo
    echo "**make_reference.py failed; nothing to compare**"
    return 1
  fi
  echo '```'
  echo

  local variant
  rm -f "$WORKDIR"/compare_nosc.json "$WORKDIR"/compare_sc.json
  for variant in nosc sc; do
    echo "## 2.$variant BatchLens forward ($variant)"
    echo
    echo '```'
    rm -f "$WORKDIR/ours_$variant.safetensors"
    if "$BL_CLI" forward --checkpoint "$WORKDIR" --inputs "$WORKDIR/inputs_$variant.safetensors" \
      --out "$WORKDIR/ours_$variant.safetensors" --device cuda --dtype bf16 --experts "$EXPERTS" \
      --taps all --policy "$POLICY"; then
      echo '```'
    else
      local rc=$?
      echo '```'
      echo
      echo "**batchlens-cli forward ($variant) failed with exit status $rc**"
      status=1
    fi
    echo
  done

  for variant in nosc sc; do
    echo "## 3.$variant Comparison ($variant)"
    echo
    if [[ -f "$WORKDIR/ours_$variant.safetensors" ]]; then
      "$PYTHON" "$HERE/compare.py" "$WORKDIR/reference_$variant.safetensors" \
        "$WORKDIR/ours_$variant.safetensors" --json "$WORKDIR/compare_$variant.json" \
        --title "$variant: BatchLens vs transformers ($EXPERTS)"
    else
      echo "PARITY: not compared ($variant: no ours_$variant.safetensors)"
    fi
    echo
  done

  echo "## Summary"
  echo
  for variant in nosc sc; do
    if [[ -f "$WORKDIR/compare_$variant.json" ]]; then
      echo "- $variant: $("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["verdict"])' \
        "$WORKDIR/compare_$variant.json")"
    else
      echo "- $variant: not compared"
    fi
  done
  return "$status"
}

set +e
main 2>&1 | tee "$REPORT"
rc=${PIPESTATUS[0]}
set -e
echo "run_parity: report in $REPORT (exit status $rc)"
exit "$rc"
