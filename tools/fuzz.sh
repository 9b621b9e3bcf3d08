#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds (if needed) and runs libFuzzer targets (tests/fuzz) of the asan preset for a bounded
# time each, and prints executions, coverage and crashes. docs/reliability.md.
# Usage: tools/fuzz.sh TARGET|all SECONDS [libFuzzer flags...]
#   TARGET: experiment_file, safetensors, config, tokenizer, generation_config, spec, policy,
#           sweep_file
# Inputs: tests/fuzz/corpus/TARGET (read only) and tests/fuzz/dict/TARGET.dict when present.
# New corpus entries go to $BL_FUZZ_WORK/TARGET/corpus, crashes (crash-*, leak-*, timeout-*,
# oom-*) to $BL_FUZZ_WORK/TARGET/artifacts; BL_FUZZ_WORK defaults to BUILD/fuzz-work.
# Environment: BL_FUZZ_BUILD (build dir, default build/asan), BL_FUZZ_NO_BUILD=1 (do not build),
# ASAN_OPTIONS, LSAN_OPTIONS, UBSAN_OPTIONS... (default: the asan test preset's environment in
# CMakePresets.json).
# A crash found: copy the artifact into tests/fuzz/regressions/TARGET/ and fix the reader;
# `ctest --preset asan` replays it from then on (fuzz.TARGET.replay).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
usage="usage: tools/fuzz.sh TARGET|all SECONDS [libFuzzer flags...]"
which=${1:?$usage}
seconds=${2:?$usage}
shift 2
build=${BL_FUZZ_BUILD:-$root/build/asan}
work=${BL_FUZZ_WORK:-$build/fuzz-work}

mapfile -t all_targets < <(cd tests/fuzz && ls -- *_fuzz.cpp | sed 's/_fuzz\.cpp$//')
if [ "$which" = all ]; then
  targets=("${all_targets[@]}")
elif [ -f "tests/fuzz/${which}_fuzz.cpp" ]; then
  targets=("$which")
else
  echo "fuzz: unknown target '$which'; targets: all ${all_targets[*]}" >&2
  exit 2
fi

if [ "${BL_FUZZ_NO_BUILD:-0}" != 1 ]; then
  if [ ! -f "$build/build.ninja" ]; then
    if [ "$build" != "$root/build/asan" ]; then
      echo "fuzz: $build is not configured" >&2
      exit 2
    fi
    cmake --preset asan >/dev/null
  fi
  if [ "$which" = all ]; then
    cmake --build "$build" --target fuzz_all
  else
    cmake --build "$build" --target "fuzz_$which"
  fi
fi

# The sanitizer settings of `ctest --preset asan`, unless the caller set their own.
preset_env=$(/usr/bin/python3 -c '
import json, sys
presets = json.load(open("CMakePresets.json"))["testPresets"]
env = next(p for p in presets if p["name"] == "asan").get("environment", {})
for k, v in env.items():
    print(k + "=" + v.replace("${sourceDir}", sys.argv[1]))
' "$root")
while IFS='=' read -r key value; do
  if [ -z "${!key:-}" ]; then
    export "$key=$value"
  fi
done <<<"$preset_env"

# One target for `seconds`; its summary line in $work/TARGET/summary.txt, the report of a failure
# in $work/TARGET/failure.txt (exit 1).
fuzz_one() {
  local t=$1
  shift
  local bin=$build/tests/fuzz/fuzz_$t
  local dir=$work/$t
  local rc before execs rate last cov ft corp new found crashes line
  local args
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$dir/artifacts/")
  if [ "$t" = experiment_file ] || [ "$t" = sweep_file ]; then
    # HDF5 leaks on damaged files (tests/sanitizers/lsan.supp), so nearly every input looks like
    # a leak and libFuzzer ran a full LeakSanitizer pass after each: two thirds of the time,
    # 13-19 instead of ~200 executions/s. fuzz.experiment_file.replay (and sweep_file's) still
    # checks for leaks when it exits.
    args+=(-detect_leaks=0)
  fi
  if [ -f "tests/fuzz/dict/$t.dict" ]; then
    args+=(-dict="$root/tests/fuzz/dict/$t.dict")
  fi
  before=$(find "$dir/artifacts" -type f | sort)
  rc=0
  "$bin" "${args[@]}" "$@" "$dir/corpus" "$root/tests/fuzz/corpus/$t" >"$dir/fuzz.log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/fuzz.log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/fuzz.log" | tail -1)
  last=$(grep -E '^#[0-9]+.*cov: ' "$dir/fuzz.log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9]*[a-zA-Z]*\).*/\1/p' <<<"$last")
  new=$(find "$dir/corpus" -type f | wc -l)
  found=$(comm -13 <(echo "$before") <(find "$dir/artifacts" -type f | sort) | sed '/^$/d')
  crashes=$(grep -c . <<<"$found" || true)
  line="$t: ${execs:-?} executions (${rate:-?}/s), cov ${cov:-?} ft ${ft:-?}, corpus ${corp:-?} ($new in $dir/corpus), crashes $crashes"
  echo "$line" >"$dir/summary.txt"
  if [ "$rc" -ne 0 ] || [ "$crashes" -gt 0 ]; then
    {
      echo "fuzz $t FAILED (exit $rc); the report:"
      grep -vE '^#[0-9]+|^INFO:' "$dir/fuzz.log" | tail -60
      sed 's/^/  artifact: /' <<<"$found"
    } >"$dir/failure.txt"
    return 1
  fi
  return 0
}

# BL_FUZZ_JOBS targets at a time (default 1): libFuzzer runs one process per target, so on two
# cores two targets take the time of one (CI, scripts/run-tests.sh).
jobs=${BL_FUZZ_JOBS:-1}
failed=()
summary=()
pids=()
names=()
finish() {  # waits for the oldest running target and reports it
  local t=${names[0]} rc=0
  wait "${pids[0]}" || rc=$?
  pids=("${pids[@]:1}")
  names=("${names[@]:1}")
  line=$(cat "$work/$t/summary.txt" 2>/dev/null || echo "$t: no summary")
  echo "$line"
  summary+=("$line")
  if [ "$rc" -ne 0 ]; then
    failed+=("$t")
    cat "$work/$t/failure.txt" >&2 2>/dev/null || true
  fi
}
for t in "${targets[@]}"; do
  mkdir -p "$work/$t/corpus" "$work/$t/artifacts"
  rm -f "$work/$t/summary.txt" "$work/$t/failure.txt"
  echo "--- fuzz $t: $seconds s (log $work/$t/fuzz.log)"
  fuzz_one "$t" "$@" &
  pids+=($!)
  names+=("$t")
  if [ ${#pids[@]} -ge "$jobs" ]; then
    finish
  fi
done
while [ ${#pids[@]} -gt 0 ]; do
  finish
done

if [ ${#targets[@]} -gt 1 ]; then
  echo "=== fuzz summary ($seconds s each)"
  printf '  %s\n' "${summary[@]}"
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: crashes or errors in: ${failed[*]} (artifacts under $work/<target>/artifacts)" >&2
  exit 1
fi
