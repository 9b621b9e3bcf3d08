#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Run HERE (Debian, where apt works), before sending the tree to a GPU server that has no
# package registry: unpacks the header-only libraries and GoogleTest's sources that core, the
# CLI and the tests need into .deps/ (git-ignored; name it in the device tool's `carry`).
set -euo pipefail
cd "$(dirname "$0")/.."
# zlib (core links ZLIB::ZLIB) is not among them: the server's libhdf5-dev depends on zlib1g-dev.
pkgs=(nlohmann-json3-dev libcli11-dev googletest)
rm -rf .deps && mkdir -p .deps/debs
(cd .deps/debs && apt-get download "${pkgs[@]}" >/dev/null)
for deb in .deps/debs/*.deb; do
  dpkg-deb -x "$deb" .deps
done
rm -rf .deps/debs .deps/usr/share/doc
du -sh .deps
