#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Regenerates resources/text/words.txt, the readable vocabulary of the tokenizers BatchLens
# generates for presets (core/text/tokenizer_builder.cpp), from Debian's wamerican word list.
# Deterministic: lowercase a-z words of 3..9 letters, every 3rd in C-locale order, so the
# committed file changes only if Debian's list does. Usage: tools/make_wordlist.sh [WORDS]
set -euo pipefail
src=${1:-/usr/share/dict/american-english}
out="$(cd "$(dirname "$0")/.." && pwd)/resources/text/words.txt"
LC_ALL=C grep -E '^[a-z]{3,9}$' "$src" | LC_ALL=C sort -u | awk 'NR % 3 == 1' > "$out.tmp"
mv "$out.tmp" "$out"
echo "make_wordlist: $(wc -l < "$out") words from $src -> $out"
