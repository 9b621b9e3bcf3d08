#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Issue #34: the trained demo's decoder pass and the one-click demo through the CLI (wall clock,
# model build and kernel recording included), idle and with two busy processes beside it, native
# ISA and capped to AVX2, with the thread choice at load (BATCHLENS_THREAD_CHOICE=1) and without.
# Run from the repository root after building build/ci: bench/cpu_threads_demo.sh
cd "$(dirname "$0")/.." || exit 1
cli=build/ci/app/batchlens-cli
demo() { /usr/bin/time -f "%e s wall" "$cli" run --preset demo-trained --policy emulated_h200 --batch-sizes 2,4 --repeats 1 --max-new-tokens 32 --steps 32 --prompt "In the beginning God created the heaven and the earth." --out /tmp/b34.h5 2>&1 >/tmp/b34.txt | tail -1; grep -o "[0-9]* LibTorch thread[s]*" /tmp/b34.txt; }
fwd() { "$cli" forward --preset demo-trained --rows 1 --repeat 20 2>&1 | grep -o "x20: median [0-9.]* ms\|CPU threads: [0-9]* of [0-9]*"; }
for load in idle busy; do
  for isa in native avx2; do
    for choice in 1 0; do
      if [ $load = busy ]; then sha256sum /dev/zero & p1=$!; sha256sum /dev/zero & p2=$!; sleep 1; fi
      if [ $isa = avx2 ]; then export ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2; else unset ONEDNN_MAX_CPU_ISA ATEN_CPU_CAPABILITY; fi
      export BATCHLENS_THREAD_CHOICE=$choice
      echo "== $load $isa choice=$choice"
      fwd | tr '\n' ' '; echo
      demo | tr '\n' ' '; echo
      if [ $load = busy ]; then kill "$p1" "$p2"; wait "$p1" "$p2" 2>/dev/null; fi
    done
  done
done
