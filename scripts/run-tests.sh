#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One command on a fresh Debian 12 machine: install what is missing, build and run every test
# that needs no GPU. This is exactly what CI runs (.ci/run). Steps, in order:
#   1. format check   2. layer check   3. ci build (warnings as errors) + ctest (all but gpu)
#   4. cli-only build with Qt hidden + its tests   5. clang-tidy on project sources
# Set BL_SKIP_TIDY=1 to skip step 5 locally (CI always runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
step() { echo; echo "=== [$(( $(date +%s) - start ))s] $*"; }

step "dependencies"
scripts/install-deps.sh

step "format check (clang-format)"
tools/check_format.sh

step "layer check"
/usr/bin/python3 tools/check_layers.py

step "ci build"
cmake --preset ci
cmake --build --preset ci

step "cli-only build (no Qt)"
cmake --preset cli-only
cmake --build --preset cli-only

if [ "${BL_SKIP_TIDY:-0}" != "1" ]; then
  step "clang-tidy"
  tools/run_tidy.sh build/ci
fi

step "cli-only tests"
ctest --preset cli-only

step "all tests (ci preset, label gpu excluded)"
ctest --preset ci
