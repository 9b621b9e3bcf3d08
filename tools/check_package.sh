#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the .deb in BUILD_DIR, validates its desktop entry and AppStream metadata, installs it
# and starts the GUI from the desktop entry's Exec command under Xvfb, saving a screenshot.
# Usage (root): tools/check_package.sh BUILD_DIR [SCREENSHOT.png]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: tools/check_package.sh BUILD_DIR [SCREENSHOT.png]}
shot=${2:-/tmp/batchlens-menu.png}
(cd "$build" && cpack -G DEB >/dev/null)
deb=$(ls -t "$build"/batchlens_*_amd64.deb | head -1)
dpkg-deb -f "$deb" Package Version Depends
desktop-file-validate packaging/io.github.batchlens.BatchLens.desktop
appstreamcli validate --no-net packaging/io.github.batchlens.BatchLens.metainfo.xml
apt-get install -y -q "./$deb" >/dev/null
entry=/usr/share/applications/io.github.batchlens.BatchLens.desktop
cmd=$(sed -n 's/^Exec=//p' "$entry" | sed 's/ %[fFuU]//')
echo "check_package: starting '$cmd' from $entry under Xvfb"
xvfb-run -a -s "-screen 0 1200x800x24" bash -c \
  "$cmd & pid=\$!; sleep 5; xwininfo -root -tree | grep -q '\"BatchLens\"' || { echo 'no BatchLens window' >&2; exit 1; }; import -window root '$shot'; kill \$pid"
echo "check_package: window up; screenshot in $shot"
