#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Issue #35's findings and issue #33's samples on the GPU, as phases that resume: each call does
# the phases not yet done (a marker per phase under $STATE) until DEADLINE_S (default 540) s
# after its start, then packs what it has. Call it again on the warm machine for the rest. Run ON
# the GPU machine from the repository root, .deps/ (scripts/gpu-prepare-deps.sh) carried:
#   1. parity-eager   the padded batch of 4 against transformers' generate, eager experts
#                     (tools/parity/run_mixed_parity.sh; grouped_mm passed on the H100 before);
#   2. samples        the bundled GPU samples recorded again (scripts/gpu-samples.sh);
#   3. sweep-shared   the 26B-A4B architecture, 24 prompts (resources/prompts/sweep-24.txt) each
#                     in row 0 beside 3 companions of other lengths
#                     (resources/prompts/companions-3.txt), B=4, shared positions (transformers'
#                     generate), default kernels and, as the workaround group, batch_invariant;
#   4. sweep-per_row  the same with per-row positions;
#   5. run-causes     one `run` of the first prompt beside the companions: the causes' re-runs and
#                     the fp64 verdict (the exact reference) of the first divergent op.
# The sweeps keep 64 new tokens (2 canvases of 32, 48 steps each): the first divergence of a
# mixed batch is in the first canvas. A sweep stopped by the deadline resumes where it stopped.
# PHASES limits a call to some of them (a fresh machine does not know what an earlier one did).
# Everything lands in $OUT/mixed.tgz.part-NN (15 MB parts) and $OUT/run.log.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
t0=$(date +%s)
out=${OUT:-$PWD/out}
build=${BUILD_DIR:-/tmp/batchlens-gpu}
state=${STATE:-/tmp/bl-mixed}
work=$state/files
mkdir -p "$out" "$work"
left() { echo $(( ${DEADLINE_S:-540} - ($(date +%s) - t0) )); }
# PHASES: the phases this call may do (default all five), e.g. PHASES=sweep-per_row.
phases=" ${PHASES:-parity-eager samples sweep-shared sweep-per_row run-causes} "
done_() { [ -f "$state/$1.done" ] || [[ "$phases" != *" $1 "* ]]; }
mark() { touch "$state/$1.done"; }
cli="$build/app/batchlens-cli"
sweep() {  # POSITIONS
  local dir=$work/sweep-$1 budget
  # SEED_PER_ROW=DIR: the per-row sweep goes on from a folder of an earlier call on the same kind
  # of GPU (e.g. a folder of a sweep stopped part-way, committed under docs/findings/).
  if [ "$1" = per_row ] && [ -n "${SEED_PER_ROW:-}" ] && [ ! -d "$dir" ]; then
    cp -r "$SEED_PER_ROW" "$dir"
  fi
  budget=$(( $(left) - 25 ))
  [ "$budget" -gt 30 ] || return 1
  timeout -s INT "$budget" "$cli" sweep --preset 26b-a4b --device cuda --dtype bf16 \
    --experts grouped_mm --batch-sizes 4 --companions resources/prompts/companions-3.txt \
    --positions "$1" --workaround batch_invariant --mode free --max-new-tokens 64 \
    --prompts resources/prompts/sweep-24.txt --seeds 0 --progress json --out "$dir" \
    >"$work/sweep-$1.txt" 2>>"$work/sweep-$1.progress.jsonl"
  local rc=$?
  echo "sweep $1: rc=$rc  $(( $(date +%s) - t0 )) s"
  [ $rc = 0 ] || return 1
  "$cli" summary "$dir" >"$work/sweep-$1-summary.txt" 2>&1
  cp "$dir/sweep.h5" "$work/26ba4b-mixed-$1-sweep.h5"
}
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  if [ ! -x "$cli" ]; then
    OUT="$work" scripts/gpu-build.sh --cli "$build" >"$work/build-stdout.log" 2>&1 ||
      { echo "build failed"; tail -30 "$work/build-stdout.log"; exit 1; }
  fi
  "$cli" --version
  echo "built in $(( $(date +%s) - t0 )) s"
  if ! done_ parity-eager; then
    BL_CLI="$cli" tools/parity/run_mixed_parity.sh resources/models/mid.json \
      /tmp/parity-mixed-eager eager >"$work/parity-eager.log" 2>&1
    echo "mixed parity (eager): exit $?"
    cp /tmp/parity-mixed-eager/generate_parity_report.md "$work/mixed-parity-eager.md"
    cp /tmp/parity-mixed-eager/generate_parity.json "$work/mixed-parity-eager.json"
    grep "GENERATE PARITY\|raw logits\|mixed batch" "$work/mixed-parity-eager.md"
    mark parity-eager
    echo "  $(( $(date +%s) - t0 )) s"
  fi
  if ! done_ samples && [ "$(left)" -gt 150 ]; then
    OUT="$work" BUILD_DIR="$build" scripts/gpu-samples.sh >/dev/null 2>&1
    grep "gpu-samples:" "$work/samples.log"
    mark samples
    echo "  $(( $(date +%s) - t0 )) s"
  fi
  for positions in per_row shared; do
    # A sweep that failed part-way (a device error) resumes in a fresh process while time is left.
    for _ in 1 2 3; do
      done_ "sweep-$positions" || { sweep "$positions" && mark "sweep-$positions"; }
    done
  done
  if ! done_ run-causes && [ "$(left)" -gt 120 ]; then
    timeout -s INT $(( $(left) - 20 )) "$cli" run --preset 26b-a4b --device cuda --dtype bf16 \
      --experts grouped_mm --batch-sizes 4 --companions resources/prompts/companions-3.txt \
      --positions shared --mode free --max-new-tokens 64 \
      --prompt "$(head -1 resources/prompts/sweep-24.txt)" --out "$work/26ba4b-mixed-run.h5" \
      >"$work/26ba4b-mixed-run.txt" 2>"$work/26ba4b-mixed-run.err"
    rc=$?
    echo "run-causes: rc=$rc  $(( $(date +%s) - t0 )) s"
    [ $rc = 0 ] && "$cli" summary --json "$work/26ba4b-mixed-run.h5" \
      >"$work/26ba4b-mixed-run.json" 2>&1 && mark run-causes
  fi
  echo "phases done: $(cd "$state" && ls ./*.done 2>/dev/null | tr '\n' ' ')"
  echo "gpu-mixed-sweeps: $(( $(date +%s) - t0 )) s"
} 2>&1 | tee -a "$work/run.log"
tar czf - -C "$work" . | split -b 15M -d - "$out/mixed.tgz.part-"
cp "$work/run.log" "$out/"
ls -l "$out"
