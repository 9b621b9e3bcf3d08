#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# clang-tidy (checks in .clang-tidy, ui/.clang-tidy) over the project's .cpp files, using the
# compile database of a configured build. Files whose result is cached as clean (same content,
# compile command, .clang-tidy, included project headers, tool and library versions) are
# skipped: tools/tidy_cached.py, cache in ~/.cache/batchlens-tidy (BL_TIDY_CACHE), switched off
# with BL_TIDY_NO_CACHE=1. Usage: tools/run_tidy.sh BUILD_DIR [files...]
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
exec /usr/bin/python3 tools/tidy_cached.py "$build" "${files[@]}"
