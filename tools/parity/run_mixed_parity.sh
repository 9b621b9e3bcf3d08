#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Issue #35's parity at B > 1: a padded batch of 4 prompts of different lengths through
# transformers' own `generate` and through `batchlens-cli generate --companions`, every row
# compared step by step (canvas in, argmax, acceptance, finished), the raw logits of each
# canvas's first step bitwise, and the final sequences. On the GPU machine:
#
#   tools/parity/run_mixed_parity.sh [PRESET_JSON] [WORKDIR] [EXPERTS]
#
# (default resources/models/mid.json, /tmp/parity-mixed, grouped_mm). The prompt under test
# (20 ids, row 0) sits beside companions of 7, 33 and 12 ids: row 0 is left-padded by 13 slots,
# and every row's positions come from the padded length, as transformers builds them.
# Report: WORKDIR/generate_parity_report.md (run_generate_parity.sh's).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PRESET=${1:-$HERE/../../resources/models/mid.json}
WORKDIR=${2:-/tmp/parity-mixed}
mkdir -p "$WORKDIR"
companions=$WORKDIR/companions.jsonl
cat > "$companions" <<'JSONL'
{"prompt_ids": [2, 105, 2364, 107, 4368, 106, 107]}
{"prompt_ids": [2, 105, 2364, 107, 818, 5279, 529, 19058, 563, 623, 1717, 20764, 1000, 5041, 532, 23761, 2094, 7607, 12, 506, 1156, 23789, 23751, 3924, 14, 531, 1492, 106, 107, 105, 4368, 107, 100]}
{"prompt_ids": [2, 105, 2364, 107, 9259, 1003, 2361, 23676, 106, 107, 105, 4368]}
JSONL
COMPANIONS=$companions ROW=${ROW:-0} BATCH=${BATCH:-4} RECORD_LOGITS=1 \
  exec "$HERE/run_generate_parity.sh" "$PRESET" "$WORKDIR" "${3:-grouped_mm}"
