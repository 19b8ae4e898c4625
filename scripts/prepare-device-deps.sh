#!/usr/bin/env bash
# Copies the header-only dependencies and GoogleTest's sources from this (Debian) machine
# into .device/third_party, which the device tool carries to the lent GPU machine: that
# machine has no package registry. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
dst=.device/third_party
mkdir -p "$dst/include"
for d in nlohmann CLI fmt; do
  rm -rf "${dst:?}/include/$d"
  cp -r "/usr/include/$d" "$dst/include/$d"
done
rm -rf "$dst/googletest"
cp -r /usr/src/googletest "$dst/googletest"
du -sh "$dst"
