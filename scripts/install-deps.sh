#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs what BatchLens needs on Debian 12 that is not there yet. Idempotent and quick when
# everything is present. Usage: scripts/install-deps.sh [--gui-check]
set -euo pipefail

packages=(
  # toolchain; ccache (every build, docs/build.md); clang 14 with its sanitizer and libFuzzer
  # runtimes and llvm-symbolizer for the asan preset and the fuzz targets (docs/reliability.md)
  build-essential cmake ninja-build git pkg-config dpkg-dev file ccache
  clang-14 libclang-rt-14-dev llvm-14
  # core: LibTorch 1.13 (CPU), HDF5 C/C++, zlib (parallel chunk compression), JSON, CLI
  libtorch-dev libhdf5-dev zlib1g-dev nlohmann-json3-dev libcli11-dev
  # ui: Qt 6 widgets and QCustomPlot built for Qt 6
  qt6-base-dev libqcustomplot-dev
  # tests, benchmarks, style checks, reading experiment files from Python
  libgtest-dev libbenchmark-dev clang-format clang-tidy python3 python3-h5py
  # clang-tidy 22 for CI's lint (tools/tidy_cached.py): it skips system headers, 2-3x faster than 14
  clang-tidy-22
  # running exported minimal repros (repro.py: plain PyTorch) in the tests
  python3-torch
  # a real single-node Slurm cluster for the sweep fan-out test (tests/app/slurm_cluster.sh)
  slurm-wlm munge
  # a real OpenSSH server on 127.0.0.1 for the remote-run test (tests/app/sshd_server.sh; ssh
  # itself runs remote experiments, issue #36)
  openssh-client openssh-server
  # bash -n and shellcheck over the generated Slurm scripts (tests/core/analysis/sweep_test.cpp)
  shellcheck
  # a readable word list for the generated demo tokenizer
  wamerican
  # the demo model's corpus: the King James Bible (tools/train_demo, public domain)
  bible-kjv
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
