#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Decoder forward time per preset on this machine's CPU (bf16, random weights and inputs, with
# self-conditioning logits, taps off): one Markdown row per preset and batch size, with the ISA
# LibTorch's kernels use (ATen's kernel set, oneDNN's ISA, whose bits bf16 matmuls have) and who
# computes them ("BatchLens" where its CPU GEMM reproduces ATen's kernel: BATCHLENS_FUSED_OFF=gemm
# times ATen's own).
# Emulate a CPU without AVX-512 on one that has it:
#   ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 bench/forward_cpu.sh
# Usage: bench/forward_cpu.sh [BUILD_DIR] [PRESETS...]   (default build/release; tiny demo mid)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
shift || true
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(tiny demo mid)
cli="$build/app/batchlens-cli"
[ -x "$cli" ] || { echo "bench: $cli not built" >&2; exit 1; }
echo "| preset | B | ISA (ATen, oneDNN, bf16 matmul) | bf16 GEMM by | decoder forward median (ms) | min (ms) | reps |"
echo "|---|---|---|---|---|---|---|"
for p in "${presets[@]}"; do
  for b in 1 4; do
    reps=10
    [ "$p" = mid ] && reps=5
    out=$("$cli" forward --preset "$p" --rows "$b" --repeat "$reps" --self-conditioning)
    line=$(grep 'decode x' <<<"$out")
    # "CPU ISA: <flags>; ATen AVX2, oneDNN avx2, bf16 matmul ATen (caps)" -> "AVX2, avx2, ATen"
    isa=$(grep 'CPU ISA:' <<<"$out" |
      sed -E 's/.*; ATen ([^,]+), oneDNN ([^,]+), bf16 matmul ([A-Za-z]+).*/\1, \2, \3/' || true)
    gemm=ATen
    grep -q 'CPU bf16 GEMM: BatchLens kernel' <<<"$out" && gemm=BatchLens
    grep -q "CPU bf16 GEMM: oneDNN" <<<"$out" && gemm=oneDNN
    median=$(sed -E 's/.*median ([0-9.]+) ms.*/\1/' <<<"$line")
    min=$(sed -E 's/.*min ([0-9.]+) ms.*/\1/' <<<"$line")
    printf '| %s | %s | %s | %s | %.1f | %.1f | %s |\n' "$p" "$b" "${isa:-?}" "$gemm" "$median" "$min" \
      "$reps"
  done
done
