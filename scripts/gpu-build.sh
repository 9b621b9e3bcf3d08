#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Run ON the GPU server (Ubuntu 24.04, PyTorch 2.x with CUDA, HDF5 serial, no Qt, no network):
# builds core + CLI + core tests against the pip wheel's LibTorch and runs every test, the gpu
# label included. Needs .deps/ from scripts/gpu-prepare-deps.sh (header-only libraries and
# GoogleTest sources). Usage: scripts/gpu-build.sh [BUILD_DIR]   (default /tmp/batchlens-gpu)
# Logs go to $OUT when set (the device tool), else to BUILD_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-/tmp/batchlens-gpu}
logs=${OUT:-$build}
mkdir -p "$build" "$logs"
[ -d .deps/usr ] || { echo "gpu-build: .deps/ missing: run scripts/gpu-prepare-deps.sh first" >&2; exit 1; }

torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

start=$(date +%s)
cmake -S . -B "$build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$torch_prefix;$PWD/.deps/usr" \
  -DBATCHLENS_BUILD_GUI=OFF \
  -DBATCHLENS_GTEST_SOURCE_DIR="$PWD/.deps/usr/src/googletest" 2>&1 | tee "$logs/configure.log"
cmake --build "$build" -j "$(nproc)" 2>&1 | tee "$logs/build.log" | tail -5
echo "gpu-build: configure + build took $(( $(date +%s) - start )) s"

"$build/app/batchlens-cli" --version | tee "$logs/version.txt"
ctest --test-dir "$build" --output-on-failure -j 4 2>&1 | tee "$logs/ctest.log"
