#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The H200 findings suite (issue #7), run ON the GPU machine from the repository root:
#   1. per preset, `free` and `lockstep` experiments, B = 1, 1 (repeat), 2, 3, 4, default policy
#      and again with the issue_workaround preset (row-wise router_proj + selfcond_matmul);
#   2. per preset, a row-wise ladder: ever wider row-wise family sets, each run as the policy
#      of B = 1, 2, 3, 4 (free), until row 0 of every batch size is bitwise identical to B = 1
#      at every step (logits, soft embedding and router scores compared).
# Each experiment leaves NAME.txt / NAME.json (summaries) in $OUT; the .h5 files stay under
# BUILD_DIR/files, except the bundled sample mid-h200-free.h5 (taps: SAMPLE_TAPS). Stops starting new
# experiments once DEADLINE_S seconds (default 560) have passed since it started.
# Usage: scripts/gpu-findings.sh [PRESET...]        (default: mid 26b-a4b)
#   STEPS_ONLY="free lockstep search" picks the parts; LADDER_FROM=N starts the ladder at rung N.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
t0=$(date +%s)
deadline=${DEADLINE_S:-560}
out=${OUT:-$PWD/out}
build=${BUILD_DIR:-/tmp/batchlens-gpu}
parts=${STEPS_ONLY:-free lockstep search}
keep=mid
mkdir -p "$out"
OUT="$out" scripts/gpu-build.sh --cli "$build" || exit 1
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(mid 26b-a4b)

left() { echo $(( deadline - ($(date +%s) - t0) )); }
experiment() {  # NAME PRESET [run options]
  local name=$1 preset=$2
  shift 2
  local budget
  budget=$(left)
  if [ "$budget" -lt 30 ]; then
    echo "findings: skipped $name (deadline)" | tee -a "$out/findings.log"
    return 1
  fi
  local keep_file=
  [[ " $keep " == *" $preset "* ]] && keep_file=1
  echo "findings: $name ($(( $(date +%s) - t0 )) s in)" | tee -a "$out/findings.log"
  local no_file=1
  [ -n "$keep_file" ] && [ "$name" = mid-h200-free ] && no_file=
  NO_FILE=$no_file SKIP_BUILD=1 BUILD_DIR="$build" OUT="$out" \
    timeout "$budget" scripts/gpu-experiment.sh "$name" --preset "$preset" "$@" \
    2>>"$out/findings.log"
  local rc=$?
  echo "findings: $name rc=$rc" | tee -a "$out/findings.log"
  return $rc
}
identical() {  # NAME: every comparison of the file bitwise identical at every step?
  python3 - "$out/$1.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
bad = [c["id"] for c in d["comparisons"] if c["first_divergence"] is not None]
print("identical" if not bad else "differs: " + ", ".join(bad))
sys.exit(0 if not bad else 1)
PY
}

ladder=(
  'selfcond_matmul'
  'router_proj,selfcond_matmul'
  'router_proj,selfcond_matmul,lm_head'
  'router_proj,selfcond_matmul,lm_head,expert_gate_up,expert_down'
  'router_proj,selfcond_matmul,lm_head,expert_gate_up,expert_down,selfcond_mlp,mlp_gate,mlp_up,mlp_down'
  'router_proj,selfcond_matmul,lm_head,expert_gate_up,expert_down,selfcond_mlp,mlp_gate,mlp_up,mlp_down,q_proj,k_proj,v_proj,o_proj'
  'router_proj,selfcond_matmul,lm_head,expert_gate_up,expert_down,selfcond_mlp,mlp_gate,mlp_up,mlp_down,q_proj,k_proj,v_proj,o_proj,attention'
)
for preset in "${presets[@]}"; do
  tag=${preset//-/}
  for mode in free lockstep; do
    [[ " $parts " == *" $mode "* ]] || continue
    name="$tag-h200-$mode"
    extra=()
    if [ "$preset" = mid ] && [ "$mode" = free ]; then
      # The bundled sample (resources/samples/mid-h200-free.h5): six taps keep it a few MB
      # and still hold the first divergence (selfcond.soft_embed is the first tap of a step).
      name=mid-h200-free
      extra=(--taps "${SAMPLE_TAPS:-selfcond.soft_embed,router.scores,router.topk_ids,moe.out,layer.out,logits}")
    fi
    experiment "$name" "$preset" --mode "$mode" --workaround issue_workaround "${extra[@]}"
  done
  [[ " $parts " == *" search "* ]] || continue
  for ((i = ${LADDER_FROM:-0}; i < ${#ladder[@]}; ++i)); do
    fams=${ladder[$i]}
    json="{\"name\":\"row_wise_search_$i\",\"rules\":[{\"families\":[\"${fams//,/\",\"}\"]}]}"
    name="$tag-h200-search$i"
    experiment "$name" "$preset" --mode free --policy "$json" --repeats 0 \
      --taps selfcond.soft_embed,router.scores,logits || break
    if verdict=$(identical "$name"); then
      echo "findings: $preset row-wise set {$fams}: $verdict" | tee -a "$out/findings.log"
      break
    fi
    echo "findings: $preset row-wise set {$fams}: $verdict" | tee -a "$out/findings.log"
  done
done
echo "findings: done in $(( $(date +%s) - t0 )) s" | tee -a "$out/findings.log"
