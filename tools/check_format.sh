#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fails when any project C++ file differs from clang-format's output. Fix with --fix.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files -co --exclude-standard -- 'core/*.h' 'core/*.cpp' 'ui/*.h' \
  'ui/*.cpp' 'app/*.h' 'app/*.cpp' 'tests/*.h' 'tests/*.cpp' 'bench/*.cpp' | sort -u)
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  echo "check_format: formatted ${#files[@]} files"
  exit 0
fi
clang-format --dry-run -Werror "${files[@]}"
echo "check_format: ${#files[@]} files clean"
