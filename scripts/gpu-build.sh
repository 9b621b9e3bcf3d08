#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Run ON the GPU server (Ubuntu 24.04, PyTorch 2.x with CUDA, HDF5 serial, no Qt, no network):
# builds core + CLI + core tests against the pip wheel's LibTorch and runs every test, the gpu
# label included. Needs .deps/ from scripts/gpu-prepare-deps.sh (header-only libraries and
# GoogleTest sources).
# Usage: scripts/gpu-build.sh [--cli | --gpu-tests] [BUILD_DIR]   (default /tmp/batchlens-gpu)
#   --cli        build only core + batchlens-cli (no tests, no ctest): what the experiment and
#                benchmark scripts need, in about half the time.
#   --gpu-tests  build core + batchlens-cli + the gpu test suite and run only the gpu label
#                (GPU_TESTS_FILTER=... : only the gpu tests this GoogleTest filter names, e.g.
#                "FusedLayer*:ProfilerGpu*"; ctest's names are the suites' shards, not the tests).
# Warnings are not errors here (BATCHLENS_WERROR=ON to make them so): a newer LibTorch or
# compiler on the server must not stop an experiment; CI builds with -Werror.
# Logs go to $OUT when set (the device tool), else to BUILD_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
cli_only=0
gpu_only=0
if [ "${1:-}" = "--cli" ]; then
  cli_only=1
  shift
elif [ "${1:-}" = "--gpu-tests" ]; then
  gpu_only=1
  shift
fi
build=${1:-/tmp/batchlens-gpu}
logs=${OUT:-$build}
mkdir -p "$build" "$logs"
[ -d .deps/usr ] || { echo "gpu-build: .deps/ missing: run scripts/gpu-prepare-deps.sh first" >&2; exit 1; }

# nvcc compiles the fused kernels (core/kernels/fused_kernels.cu); the image may not have it on PATH.
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null; then
  for c in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
    if [ -x "$c" ]; then
      export CUDACXX=$c
      break
    fi
  done
fi
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
tests=ON
targets=()
if [ "$cli_only" = 1 ]; then
  tests=OFF
  targets=(--target batchlens-cli)
elif [ "$gpu_only" = 1 ]; then
  targets=(--target batchlens-cli batchlens_gpu_tests)
fi

start=$(date +%s)
cmake -S . -B "$build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$torch_prefix;$PWD/.deps/usr" \
  -DBATCHLENS_BUILD_GUI=OFF \
  -DBATCHLENS_BUILD_TESTS="$tests" \
  -DBATCHLENS_WERROR="${BATCHLENS_WERROR:-OFF}" \
  -DBATCHLENS_GTEST_SOURCE_DIR="$PWD/.deps/usr/src/googletest" >"$logs/configure.log" 2>&1 ||
  { tail -30 "$logs/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" "${targets[@]}" >"$logs/build.log" 2>&1 ||
  { grep -B2 -A12 -m3 'error' "$logs/build.log" || tail -40 "$logs/build.log"; exit 1; }
echo "gpu-build: configure + build took $(( $(date +%s) - start )) s"

"$build/app/batchlens-cli" --version | tee "$logs/version.txt"
if [ "$gpu_only" = 1 ]; then
  if [ -n "${GPU_TESTS_FILTER:-}" ]; then
    "$build/tests/batchlens_gpu_tests" --gtest_filter="$GPU_TESTS_FILTER" 2>&1 | tee "$logs/ctest.log"
  else
    ctest --test-dir "$build" --output-on-failure -L gpu 2>&1 | tee "$logs/ctest.log"
  fi
elif [ "$cli_only" = 0 ]; then
  ctest --test-dir "$build" --output-on-failure -j 4 2>&1 | tee "$logs/ctest.log"
fi
