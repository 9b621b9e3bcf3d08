#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Issue #37's measurements in one device call, run ON the GPU machine from the repository root
# (.deps/ carried; .train_demo/ too when TRAIN_CACHE=1):
#   0. (TRAIN_CACHE=1) beside the build: train.py's --fast warm-up of every context bucket in a
#      scratch folder, which writes torch.compile's artifacts (compile-cache-*.bin, to $OUT) so
#      that the next call's 10,000-step run starts without compiling (issue #33);
#      (probe) before the build: which tensor-core fold has torch._grouped_mm's bits
#      (bench/mma_fold_probe.py);
#   1. (fused) the fused kernels accepted and a fused pass against the unfused one, B = 1 and 4;
#      where that process fails (a kernel that faults), the later steps run with
#      BATCHLENS_FUSED_OFF=experts (the experts' own GEMM unused);
#   2. `cost` of the 26B-A4B architecture: default and batch_invariant at B = 1, 2, 4, 8, 16
#      (profiled: --profile; COST_PROFILE=0 skips it) and 32 with the batch-invariant GEMM's
#      default plan (bitwise classes), then the same with BATCHLENS_BI_PLAN=$COST_ALT (default
#      timed: one algorithm per shape; fixed: the first proposal at 1024 rows; none: skipped),
#      and for each LIST of COST_OFF ("LIST LIST ...") the default kernels again with
#      BATCHLENS_FUSED_OFF=LIST;
#   3. the culprit finder with the prompt encoded as one batch (--prefill batched), its process
#      time (/usr/bin/time);
#   4. `run` B=1 vs B=4 free (kernel provenance on) and the lockstep sample's command, each timed;
#   5. (trace) the B=1 vs B=4 `run` and the lockstep sample under LibTorch's profiler
#      (BATCHLENS_TRACE), summed up by tools/trace_summary.py; (gputests) the gpu tests
#      GPU_TESTS_FILTER names (GoogleTest); (parity) tools/parity/run_parity.sh for
#      PARITY_PRESETS (default mid 26b-a4b);
#   6. with the time left, issue #35's per-row sweep (scripts/gpu-mixed-sweeps.sh, $OUT/mixed/).
# STEPS_ONLY ("cost culprit run sweep"; probe, fused, trace, gputests, parity only when named)
# picks the parts; DEADLINE_S (default 570) stops starting new ones. Everything lands in $OUT
# (issue37.tgz and run.log).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
t0=$(date +%s)
out=${OUT:-$PWD/out}
build=${BUILD_DIR:-/tmp/batchlens-gpu}
work=$(mktemp -d)
parts=" ${STEPS_ONLY:-cost culprit run sweep} "
mkdir -p "$out"
left() { echo $(( ${DEADLINE_S:-570} - ($(date +%s) - t0) )); }
stamp() { echo "  [$(( $(date +%s) - t0 )) s] $*"; }
gpu=(--device cuda --dtype bf16 --experts grouped_mm)
# The load check may also try the experts' GEMM with wgmma (off by default until a device has
# run it; BATCHLENS_EXPERT_WGMMA=0 here leaves it out).
export BATCHLENS_EXPERT_WGMMA=${BATCHLENS_EXPERT_WGMMA:-1}
timed() {  # NAME COMMAND...: the process's wall and peak memory in NAME.time
  local name=$1
  shift
  /usr/bin/time -f "%e s wall, %U s user, %M kB peak" -o "$work/$name.time" \
    timeout "$(( $(left) - 10 ))" "$@" >"$work/$name.txt" 2>"$work/$name.err"
  local rc=$?
  stamp "$name rc=$rc: $(tail -1 "$work/$name.time" 2>/dev/null)"
  return $rc
}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  cache_pid=
  if [ "${TRAIN_CACHE:-0}" = 1 ]; then
    # A scratch folder: state.pt of this warm-up never reaches the real run.
    mkdir -p /tmp/train-cache
    src=${TRAIN_CARRY:-.train_demo}
    for f in kjv.jsonl tokenizer.json; do
      [ -f "$src/$f" ] && cp "$src/$f" /tmp/train-cache/
      [ -f "$src/$f.gz" ] && gunzip -c "$src/$f.gz" >"/tmp/train-cache/$f"
    done
    (cd tools/train_demo && PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 python3 train.py \
      train --backend port --fast --device cuda --experts dense --attention eager \
      --fusion compiled --steps 10000 --warmup-share 0.03 --batch 256 --bucket 16 \
      --loss-positions all --eval-every 100000 --save-every 100000 --log-every 100 \
      --max-seconds 1 --work /tmp/train-cache --fresh >"$work/train-cache.log" 2>&1
     # The check that the artifacts are used: a second process from a fresh folder with only
     # the corpus and the cache, and inductor's and Triton's own on-disk caches elsewhere (as on
     # a fresh machine), its per-bucket warm-up times beside the first's.
     mkdir -p /tmp/train-cache2 && cp /tmp/train-cache/kjv.jsonl /tmp/train-cache/tokenizer.json \
       /tmp/train-cache/compile-cache-*.bin /tmp/train-cache2/ &&
     TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-fresh TRITON_CACHE_DIR=/tmp/inductor-fresh/triton \
     PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 python3 train.py \
      train --backend port --fast --device cuda --experts dense --attention eager \
      --fusion compiled --steps 10000 --warmup-share 0.03 --batch 256 --bucket 16 \
      --loss-positions all --eval-every 100000 --save-every 100000 --log-every 100 \
      --max-seconds 1 --work /tmp/train-cache2 --fresh >"$work/train-cache2.log" 2>&1) &
    cache_pid=$!
  fi
  if [[ "$parts" == *" probe "* ]]; then
    # Which tensor-core fold has torch._grouped_mm's bits (bench/mma_fold_probe.py): before the
    # build, a minute at most, and an answer even where the build fails.
    timeout 120 python3 bench/mma_fold_probe.py >"$work/fold-probe.txt" 2>&1
    stamp "fold probe rc=$?"
    cat "$work/fold-probe.txt"
  fi
  scripts/gpu-build.sh --cli "$build" >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }
  cli="$build/app/batchlens-cli"
  "$cli" --version
  stamp "built"
  if [ -n "$cache_pid" ]; then
    wait "$cache_pid"
    stamp "train cache rc=$?"
    grep -v "UserWarning\|warnings.warn\|softmax\|split the reduction\|important use case" \
      "$work/train-cache.log" | tail -8
    echo "  the second process, with the cache:"
    grep -v "UserWarning\|warnings.warn\|softmax\|split the reduction\|important use case" \
      "$work/train-cache2.log" | tail -8
    cp /tmp/train-cache/compile-cache-*.bin "$out/" 2>/dev/null
  fi
  if [[ "$parts" == *" fused "* ]] && [ "$(left)" -gt 60 ]; then
    # The fused kernels this device accepted (checked bitwise against ATen at load), and one
    # pass with them against the unfused eager pass, B = 1 and 4. First of the steps: a kernel
    # that faults (a sticky CUDA error ends its process) shows here, and the steps after it run
    # with the experts' own GEMM left unused (BATCHLENS_FUSED_OFF) instead of failing too.
    for bs in 1 4; do
      "$cli" forward --preset 26b-a4b "${gpu[@]}" --rows "$bs" --repeat 5 --cuda-graph \
        >"$work/forward-b$bs.txt" 2>&1
      rc=$?
      grep "fused\|graph" "$work/forward-b$bs.txt"
      if [ "$rc" != 0 ] && [[ ",${BATCHLENS_FUSED_OFF:-}," != *",experts,"* ]]; then
        stamp "forward B=$bs rc=$rc: $(tail -2 "$work/forward-b$bs.txt" | tr '\n' ' ')"
        export BATCHLENS_FUSED_OFF=${BATCHLENS_FUSED_OFF:+$BATCHLENS_FUSED_OFF,}experts
        stamp "BATCHLENS_FUSED_OFF=$BATCHLENS_FUSED_OFF from here on"
      fi
    done
  fi
  if [[ "$parts" == *" cost "* ]] && [ "$(left)" -gt 120 ]; then
    # B = 1..16, then B = 32 on its own: on an 80 GB card both policies' B=32 graphs beside the
    # 26B-A4B weights did not fit in one process.
    for bs in ${COST_BATCHES:-1,2,4,8,16 32}; do
      tag=${bs//,/-}
      extra=()
      [ "$bs" = 32 ] || [ "${COST_PROFILE:-1}" = 0 ] || extra=(--profile)
      timed "cost-classes-$tag" "$cli" cost --preset 26b-a4b "${gpu[@]}" --repeat 20 \
        --batch-sizes "$bs" "${extra[@]}" --policies default --policies batch_invariant
      grep -A3 "^policy" "$work/cost-classes-$tag.txt"
      for off in ${COST_OFF:-}; do
        # The default pass with these fused kernels left unused (the baseline of a fused
        # kernel's gain, on the same machine).
        BATCHLENS_FUSED_OFF=$off timed "cost-off-${off//,/-}-$tag" "$cli" cost --preset 26b-a4b \
          "${gpu[@]}" --repeat 20 --batch-sizes "$bs" --policies default
        grep -A2 "^policy" "$work/cost-off-${off//,/-}-$tag.txt"
      done
      alt=${COST_ALT:-timed}
      [ "$alt" = none ] && continue
      BATCHLENS_BI_PLAN=$alt timed "cost-$alt-$tag" "$cli" cost --preset 26b-a4b "${gpu[@]}" \
        --repeat 20 --batch-sizes "$bs" --policies default --policies batch_invariant
      grep -A3 "^policy" "$work/cost-$alt-$tag.txt"
    done
    grep "class of\|timed:\|first proposal" "$work"/cost-classes-*.txt | head -20
  fi
  if [[ "$parts" == *" culprit "* ]] && [ "$(left)" -gt 90 ]; then
    timed culprit-batched "$cli" culprit --preset 26b-a4b "${gpu[@]}" --batch-sizes 2,3,4 \
      --repeats 0 --prefill batched --out "$work/culprit-batched.h5"
    "$cli" summary "$work/culprit-batched.h5" >"$work/culprit-batched-summary.txt" 2>&1
    grep "culprit finder\|minimal" "$work/culprit-batched-summary.txt" | head -4
  fi
  if [[ "$parts" == *" run "* ]] && [ "$(left)" -gt 60 ]; then
    timed run-b4 "$cli" run --preset 26b-a4b "${gpu[@]}" --batch-sizes 4 --repeats 0 \
      --out "$work/run-b4.h5"
    grep "^time" "$work/run-b4.txt"
    timed run-lockstep "$cli" run --preset 26b-a4b "${gpu[@]}" --mode lockstep \
      --workaround issue_workaround --batch-sizes 2,4 \
      --taps selfcond.soft_embed,router.scores,router.topk_ids,logits --out "$work/lockstep.h5"
    grep "^time" "$work/run-lockstep.txt"
    # The same without the exact reference (its re-run to the divergence and fp64 products).
    timed run-lockstep-noexact "$cli" run --preset 26b-a4b "${gpu[@]}" --mode lockstep \
      --workaround issue_workaround --batch-sizes 2,4 --no-exact \
      --taps selfcond.soft_embed,router.scores,router.topk_ids,logits --out "$work/lockstep2.h5"
    grep "^time" "$work/run-lockstep-noexact.txt"
  fi
  if [[ "$parts" == *" trace "* ]] && [ "$(left)" -gt 60 ]; then
    # Where a run's time goes: the B=1 vs B=4 command and the lockstep sample under LibTorch's
    # profiler (BATCHLENS_TRACE; kernel provenance off, it profiles too), summed up by
    # tools/trace_summary.py (the traces stay here: hundreds of MB).
    BATCHLENS_TRACE=/tmp/trace-b4.json timed trace-b4 "$cli" run --preset 26b-a4b "${gpu[@]}" \
      --batch-sizes 4 --repeats 0 --no-kernels --out "$work/trace-b4.h5"
    python3 tools/trace_summary.py /tmp/trace-b4.json --top 40 >"$work/trace-b4-summary.txt" 2>&1
    head -60 "$work/trace-b4-summary.txt"
    BATCHLENS_TRACE=/tmp/trace-lockstep.json timed trace-lockstep "$cli" run --preset 26b-a4b \
      "${gpu[@]}" --mode lockstep --workaround issue_workaround --batch-sizes 2,4 --no-kernels \
      --taps selfcond.soft_embed,router.scores,router.topk_ids,logits --out "$work/trace-ls.h5"
    python3 tools/trace_summary.py /tmp/trace-lockstep.json --top 40 \
      >"$work/trace-lockstep-summary.txt" 2>&1
    head -30 "$work/trace-lockstep-summary.txt"
  fi
  if [[ "$parts" == *" gputests "* ]] && [ "$(left)" -gt 120 ]; then
    # The gpu tests the GoogleTest filter GPU_TESTS_FILTER names (default: the fused kernels');
    # after a fault in step 1 without the expert GEMM's own test (its fault ends the process).
    filter=${GPU_TESTS_FILTER:-FusedLayer*}
    if [[ ",${BATCHLENS_FUSED_OFF:-}," == *",experts,"* ]]; then
      [[ "$filter" == *-* ]] && filter+=":FusedLayerGpu.ExpertGemm*" ||
        filter+="-FusedLayerGpu.ExpertGemm*"
    fi
    GPU_TESTS_FILTER=$filter scripts/gpu-build.sh --gpu-tests \
      /tmp/batchlens-gpu-tests >"$work/gputests.log" 2>&1
    stamp "gpu tests rc=$?"
    grep -E "^\[  (PASSED|FAILED) |^\[       OK|^\[  FAILED|tests passed|Failure|mean of squares" \
      "$work/gputests.log" | head -30
  fi
  if [[ "$parts" == *" parity "* ]] && [ "$(left)" -gt 120 ]; then
    # tools/parity: the forward pass against transformers 5.17, every tap (PARITY_PRESETS).
    for preset in ${PARITY_PRESETS:-mid 26b-a4b}; do
      [ "$(left)" -gt 90 ] || break
      BL_CLI="$cli" timeout "$(( $(left) - 20 ))" tools/parity/run_parity.sh \
        "resources/models/$preset.json" "/tmp/parity-$preset" grouped_mm >/dev/null 2>&1
      stamp "parity $preset rc=$?"
      cp "/tmp/parity-$preset/parity_report.md" "$work/parity-$preset.md" 2>/dev/null
      grep -A3 "^## Summary" "$work/parity-$preset.md" 2>/dev/null
      rm -rf "/tmp/parity-$preset"
    done
  fi
  # What time is left: issue #35's per-row sweep (resumable; its folder comes back packed).
  if [[ "$parts" == *" sweep "* ]] && [ "$(left)" -gt 90 ]; then
    PHASES=sweep-per_row DEADLINE_S=$(( $(left) - 15 )) BUILD_DIR="$build" OUT="$out/mixed" \
      scripts/gpu-mixed-sweeps.sh >/dev/null 2>&1
    stamp "per-row sweep: $(grep -h 'sweep per_row' "$out"/mixed/run.log | tr '\n' ' ')"
  fi
  rm -f "$work"/*.h5
  stamp "done"
} 2>&1 | tee "$work/run.log"
tar czf "$out/issue37.tgz" -C "$work" .
cp "$work/run.log" "$out/"
# torch.compile's artifacts (30 MB on the H100), gzipped, in parts under the 16 MB a returned file
# may have (tools/train_demo/h200_fast.sh, TRAIN_CARRY, says how they travel back).
for f in "$out"/compile-cache-*.bin; do
  [ -f "$f" ] || continue
  gzip -9 -c "$f" | split -b 15M -d - "$f.gz.part-"
  echo "$(basename "$f"): $(stat -c %s "$f") bytes, gzip -9 $(cat "$f".gz.part-* | wc -c)" |
    tee -a "$out/run.log"
  rm -f "$f"
done
