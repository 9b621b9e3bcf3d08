#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs a libFuzzer executable once on every file of the given directories (seed corpus and
# regression inputs) and fails on the first crash, sanitizer report or timeout.
# Usage: tests/fuzz/replay.sh FUZZ_BINARY DIR...
set -euo pipefail
bin=${1:?usage: replay.sh FUZZ_BINARY DIR...}
shift
files=()
for dir in "$@"; do
  [ -d "$dir" ] || continue
  while IFS= read -r -d '' f; do
    files+=("$f")
  done < <(find "$dir" -type f ! -name 'README*' -print0 | sort -z)
done
if [ ${#files[@]} -eq 0 ]; then
  echo "replay: no inputs in $*"
  exit 0
fi
echo "replay: ${#files[@]} inputs through $(basename "$bin")"
exec "$bin" -timeout=10 -rss_limit_mb=2048 "${files[@]}"
