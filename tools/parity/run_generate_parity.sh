#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Generation parity of `batchlens-cli generate` against transformers' `generate`, on the GPU
# machine.
#
#   tools/parity/run_generate_parity.sh PRESET_JSON WORKDIR [EXPERTS]
#
# Writes a seeded random checkpoint into WORKDIR (make_reference.py, unless WORKDIR already
# holds one), runs BatchLens's generate on it with --record, then replays BatchLens's random
# draws through the reference's generate and compares every denoising step
# (generate_reference.py). Report: WORKDIR/generate_parity_report.md.
# Environment: BL_CLI, PYTHON as run_parity.sh; BATCH (default 1), STEPS (48),
# MAX_NEW (two canvases), RNG (per_row), PROMPT_IDS (20 ids below the vocabulary size);
# COMPANIONS (a companions file: a mixed batch of BATCH rows, issue #35) with ROW (0), the
# positions shared as transformers' generate has them; RECORD_LOGITS (1: each canvas's first-step
# logits compared bitwise too).
set -euo pipefail
export PYTHONUNBUFFERED=1
if [[ $# -lt 2 || $# -gt 3 ]]; then
  echo "usage: $0 PRESET_JSON WORKDIR [grouped_mm|eager]" >&2
  exit 2
fi
PRESET=$1
WORKDIR=$2
EXPERTS=${3:-grouped_mm}
BL_CLI=${BL_CLI:-/tmp/batchlens-gpu/app/batchlens-cli}
PYTHON=${PYTHON:-python3}
BATCH=${BATCH:-1}
STEPS=${STEPS:-48}
RNG=${RNG:-per_row}
# The spec's chat-template ids with the three above 32767 replaced, so that `mid` takes them.
PROMPT_IDS=${PROMPT_IDS:-2,105,2364,107,6974,496,1440,20494,1003,2361,23676,106,107,105,4368,107,100,4551,107,101}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CANVAS=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("canvas_length", 256))' "$PRESET")
MAX_NEW=${MAX_NEW:-$((2 * CANVAS))}
mkdir -p "$WORKDIR"
REPORT="$WORKDIR/generate_parity_report.md"

main() {
  echo "# BatchLens generate parity"
  echo
  echo "- preset \`$PRESET\`, experts \`$EXPERTS\`, batch $BATCH, rng $RNG, $STEPS steps, max_new_tokens $MAX_NEW"
  [[ -n "${COMPANIONS:-}" ]] && echo "- mixed batch: row ${ROW:-0} under test, companions \`$COMPANIONS\` (cycled), positions shared"
  echo "- date $(date -u +%Y-%m-%dT%H:%M:%SZ), repo $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "- gpu $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1 || echo '?')"
  echo
  if [[ ! -f "$WORKDIR/config.json" || ! -f "$WORKDIR/reference_meta.json" ]]; then
    echo "## Checkpoint (make_reference.py)"
    echo '```'
    "$PYTHON" "$HERE/make_reference.py" --config "$PRESET" --out "$WORKDIR" --experts "$EXPERTS" \
      --no-repeat-check
    echo '```'
  fi
  echo "## BatchLens generate"
  echo '```'
  local mixed=()
  [[ -n "${COMPANIONS:-}" ]] && mixed=(--companions "$COMPANIONS" --row "${ROW:-0}" --positions shared)
  [[ "${RECORD_LOGITS:-1}" = 1 ]] && mixed+=(--record-logits)
  "$BL_CLI" generate --checkpoint "$WORKDIR" --prompt-ids "$PROMPT_IDS" --batch "$BATCH" \
    --rng "$RNG" --steps "$STEPS" --max-new-tokens "$MAX_NEW" --device cuda --dtype bf16 \
    --experts "$EXPERTS" "${mixed[@]}" --record "$WORKDIR/generate_record.safetensors" \
    --show-ids 2>/dev/null
  echo '```'
  echo "## Reference replay and comparison"
  echo '```'
  "$PYTHON" "$HERE/generate_reference.py" --checkpoint "$WORKDIR" \
    --record "$WORKDIR/generate_record.safetensors" --experts "$EXPERTS" \
    --json "$WORKDIR/generate_parity.json"
  echo '```'
}

set +e
main 2>&1 | tee "$REPORT"
rc=${PIPESTATUS[0]}
set -e
echo "run_generate_parity: report in $REPORT (exit status $rc)"
exit "$rc"
