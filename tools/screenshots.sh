#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Screenshots of the real BatchLens window under Xvfb (X11, the xcb platform), one per explorer
# tab, on the embedded sample or FILE (":/samples/26ba4b-h100-lockstep.h5" for the bundled 26B-A4B
# one), plus the exported report's composite figure. Usage: tools/screenshots.sh BUILD_DIR [FILE]
# Needs xvfb (apt-get install xvfb). Writes docs/screenshots/tab-*.png and figure.png (PREFIX=
# names them PREFIX-tab-*.png instead).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: tools/screenshots.sh BUILD_DIR [FILE]}
file=${2:-}
gui="$build/app/batchlens"
[ -x "$gui" ] || { echo "screenshots: $gui not built" >&2; exit 1; }
command -v xvfb-run >/dev/null || { echo "screenshots: xvfb-run missing (apt-get install xvfb)" >&2; exit 1; }
# A private settings directory: saved window geometry or run-panel values must not leak in.
config=$(mktemp -d)
trap 'rm -rf "$config"' EXIT
mkdir -p docs/screenshots
names=(overview layer-step canvas-spread text-diff routing)
# Every tab opens on the first divergence (its tap and cell) unless TAP names another tap.
tap=("" "${TAP:-}" "${TAP:-}" "" "")
prefix=${PREFIX:+$PREFIX-}
for i in "${!names[@]}"; do
  out="docs/screenshots/${prefix}tab-$i-${names[$i]}.png"
  XDG_CONFIG_HOME="$config" QT_QPA_PLATFORM=xcb xvfb-run -a -s "-screen 0 1600x1000x24" \
    "$gui" --tab "$i" ${tap[$i]:+--tap "${tap[$i]}"} --screenshot "$out" ${file:+"$file"}
  echo "screenshots: $out"
done
report=$(mktemp -d)/report
XDG_CONFIG_HOME="$config" QT_QPA_PLATFORM=xcb xvfb-run -a -s "-screen 0 1600x1000x24" \
  "$gui" --export-report "$report" ${file:+"$file"}
cp "$report/figure.png" "docs/screenshots/${prefix}figure.png"
cp "$report/summary.md" "docs/screenshots/${prefix}summary.md"
echo "screenshots: docs/screenshots/${prefix}figure.png and ${prefix}summary.md"
