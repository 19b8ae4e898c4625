#!/usr/bin/env bash
# Extracts the source tree of a commit under .device/trees/<commit> (the device tool carries
# .device), for scripts/gpu-bench-trees.sh to build and time beside the working tree.
set -euo pipefail
cd "$(dirname "$0")/.."
commit=${1:?usage: scripts/prepare-bench-tree.sh <commit>}
dst=.device/trees/$commit
rm -rf "$dst"
mkdir -p "$dst"
git archive "$commit" | tar -x -C "$dst"
du -sh "$dst"
