#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# (Re)makes the checked-in seed corpora tests/fuzz/corpus/<target>/ with BatchLens's own
# writers, from the asan build: fuzz_make_seeds (safetensors, presets' config.json, a Gemma-like
# tokenizer.json, generation configs, policies, specs) and batchlens-cli (save-model --preset
# tiny; two small experiment files from `run --preset tiny`; lockstep
# files are not written: the writer refuses their rows comparisons, docs/reliability.md). Not run by CI; the files are
# committed. Usage: tools/fuzz_seeds.sh
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BL_FUZZ_BUILD:-build/asan}
cmake --build "$build" --target fuzz_make_seeds batchlens-cli
corpus=tests/fuzz/corpus
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-14/bin/llvm-symbolizer
export LSAN_OPTIONS=suppressions=$PWD/tests/sanitizers/lsan.supp

"$build/tests/fuzz/fuzz_make_seeds" "$corpus"

cli=$build/app/batchlens-cli
"$cli" save-model --preset tiny --out "$tmp/tiny"
cp "$tmp/tiny/config.json" "$corpus/config/tiny_saved.json"
cp "$tmp/tiny/generation_config.json" "$corpus/generation_config/tiny_saved.json"
cp "$tmp/tiny/tokenizer.json" "$corpus/tokenizer/tiny_saved.json"

mkdir -p "$corpus/experiment_file"
"$cli" run --preset tiny --prompt-ids 2,105,50 --steps 2 --max-new-tokens 16 --batch-sizes 2 \
  --out "$corpus/experiment_file/tiny_free_b2.h5" >/dev/null
"$cli" run --preset tiny --prompt-ids 2,105,50 --steps 2 --max-new-tokens 16 --batch-sizes 3 \
  --policy emulated_split_k --workaround issue_workaround --taps logits \
  --out "$corpus/experiment_file/tiny_emulated_workaround_b3.h5" >/dev/null
ls -la "$corpus"/*
