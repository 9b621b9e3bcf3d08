#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One command on a fresh Debian 12 machine: install what is missing, build and run every test
# that needs no GPU. This is exactly what CI runs (.ci/run). Each test runs once, in one build
# (issue #31, docs/build.md). Steps, in order:
#   1. format check   2. layer check   3. ci build (GCC, warnings as errors, unity batches):
#      the executables and every suite but the unit ones (built and run in step 8)
#   4. cli-only build with Qt hidden: the CLI and its tests (the ci flags: objects from ccache)
#   5. clang-tidy on project sources (files known clean are skipped: tools/tidy_cached.py)
#   6. the CLI tests (label cli) against the CLI built without Qt, as GPU servers build it
#   7. the integration, ui and slow tests (whole model runs, windows, file mutations) in the ci build
#   8. asan build (clang-14, AddressSanitizer + UBSan) of the unit suites and the libFuzzer
#      targets; the unit tests and the fuzz regression replays under it
#   9. every fuzz target for BL_FUZZ_SECONDS (default 25) seconds, two at a time, from libFuzzer seed BL_FUZZ_SEED
#      (default 1: a CI run does not turn red on a find that depends on its random seed; new
#      finds come from longer runs, tools/fuzz.sh) (docs/reliability.md)
# Builds, clang-tidy and ctest run BL_JOBS jobs (default twice the cores): on a machine that
# other work shares, more jobs than cores keep this run's share of the CPU (docs/build.md).
# Set BL_SKIP_TIDY=1 to skip step 5, BL_SKIP_ASAN=1 steps 8-9 (the unit tests then run in the
# ci build), BL_FUZZ_SECONDS=0 step 9 locally (CI always runs them all). Step times are printed
# at the end (docs/build.md).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
step_name=""
step_start=$start
timings=()
end_step() {
  if [ -n "$step_name" ]; then
    timings+=("$(printf '%6ds  %s' $(( $(date +%s) - step_start )) "$step_name")")
  fi
}
step() {
  end_step
  step_name=$*
  step_start=$(date +%s)
  echo
  echo "=== [$(( step_start - start ))s] $*"
}
report() {
  local rc=$?
  end_step
  step_name=""
  echo
  echo "=== step times (total $(( $(date +%s) - start )) s$([ "$rc" -ne 0 ] && echo ", FAILED"))"
  printf '%s\n' "${timings[@]}"
  if command -v ccache >/dev/null; then
    ccache --show-stats 2>/dev/null | grep -E 'Hits|Misses|Cache size' || true
  fi
}
trap report EXIT

step "dependencies"
scripts/install-deps.sh

# Every build goes through ccache (CMakeLists.txt): one cache outside the clone, shared by the
# build directories (paths under the source dir are hashed relative to it).
export CCACHE_BASEDIR=$PWD
export CCACHE_NOHASHDIR=true
ccache --max-size=5G >/dev/null
ccache --zero-stats >/dev/null

step "format check (clang-format)"
tools/check_format.sh

step "layer check"
/usr/bin/python3 tools/check_layers.py

jobs=${BL_JOBS:-$(( $(nproc) * 2 ))}
export BL_TIDY_JOBS=${BL_TIDY_JOBS:-$jobs}

step "ci build"
cmake --preset ci
cmake --build --preset ci -j "$jobs" --target batchlens_release_checks

step "cli-only build (no Qt): the CLI and its tests"
cmake --preset cli-only
cmake --build --preset cli-only -j "$jobs" --target batchlens_cli_tests

if [ "${BL_SKIP_TIDY:-0}" != "1" ]; then
  step "clang-tidy"
  tools/run_tidy.sh build/ci
fi

# The CLI end-to-end tests check the command-line tool as it is built without Qt (GPU servers).
step "CLI tests (the CLI built without Qt, label cli)"
ctest --preset cli-only -L cli -j "$jobs"

step "integration, ui and slow tests (ci build; not cli)"
ctest --preset ci-integration -j "$jobs"

if [ "${BL_SKIP_ASAN:-0}" == "1" ]; then
  step "unit tests (ci build: BL_SKIP_ASAN=1)"
  cmake --build --preset ci -j "$jobs" --target batchlens_unit_tests
  ctest --preset ci -L unit -j "$jobs"
else
  step "asan build (clang-14, AddressSanitizer + UBSan): the unit suites and the fuzz targets"
  cmake --preset asan
  cmake --build --preset asan -j "$jobs" --target batchlens_unit_tests fuzz_all

  step "unit tests and fuzz regression replays under the sanitizers"
  ctest --preset asan-unit -j "$jobs"

  if [ "${BL_FUZZ_SECONDS:-25}" != "0" ]; then
    step "fuzz (${BL_FUZZ_SECONDS:-25} s per target)"
    BL_FUZZ_NO_BUILD=1 BL_FUZZ_JOBS=2 BL_FUZZ_WORK=build/asan/fuzz-ci \
      tools/fuzz.sh all "${BL_FUZZ_SECONDS:-25}" \
      -seed="${BL_FUZZ_SEED:-1}"
  fi
fi
