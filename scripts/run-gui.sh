#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One command on a fresh Debian 12 machine: install what is missing, build (release preset)
# and start the BatchLens GUI on its embedded default. Extra arguments go to batchlens.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake --preset release
cmake --build --preset release --target batchlens

if [ -z "${DISPLAY:-}" ] && [ -z "${WAYLAND_DISPLAY:-}" ] && [ -z "${QT_QPA_PLATFORM:-}" ]; then
  echo "run-gui: no display (DISPLAY/WAYLAND_DISPLAY unset). Run from a desktop session," >&2
  echo "         over 'ssh -X', or under Xvfb: xvfb-run -a scripts/run-gui.sh" >&2
  exit 1
fi
exec build/release/app/batchlens "$@"
