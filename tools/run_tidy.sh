#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# clang-tidy (checks in .clang-tidy, ui/.clang-tidy) over the project's .cpp files, using the
# compile database of a configured build. Usage: tools/run_tidy.sh BUILD_DIR [files...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: tools/run_tidy.sh BUILD_DIR [files...]}
shift
if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(git ls-files -co --exclude-standard -- 'core/*.cpp' 'ui/*.cpp' 'app/*.cpp' \
    | grep -v '_cuda\.cpp$' | sort -u)
fi
jobs=$(nproc)
printf '%s\n' "${files[@]}" | xargs -P "$jobs" -n 1 clang-tidy -p "$build" --quiet 2>/dev/null \
  | tee /tmp/batchlens-tidy.log
if grep -qE '(warning|error):' /tmp/batchlens-tidy.log; then
  echo "run_tidy: clang-tidy found problems" >&2
  exit 1
fi
echo "run_tidy: ${#files[@]} files clean"
