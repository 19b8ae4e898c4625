#!/usr/bin/env bash
# Copies the header-only dependencies, GoogleTest's sources and nanobind from this (Debian)
# machine into .device/third_party, which the device tool carries to the lent GPU machine:
# that machine has no package registry. Idempotent.
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
# nanobind (pure source, pinned by bootstrap.sh) for the Python module: the device's own
# Python may carry another version; device-build.sh puts this copy first on PYTHONPATH.
nb_dir=$(python3 -c "import nanobind, os; print(os.path.dirname(nanobind.__file__))")
rm -rf "$dst/python"
mkdir -p "$dst/python"
cp -r "$nb_dir" "$dst/python/nanobind"
rm -rf "$dst/python/nanobind/__pycache__"
du -sh "$dst"
