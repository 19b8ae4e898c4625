#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root: the same benchmark
# sections on this tree and on other source trees, built separately, run alternately
# (A B A B ...) on the same card, so a kernel change is timed against the code before it
# rather than against a number from another card or day.
#   BENCH_TREES=".device/trees/0746a58" BENCH_ROUNDS=2 CSATTN_BENCH_SECTIONS=indexer \
#     bash scripts/gpu-bench-trees.sh
# Each tree under BENCH_TREES is a plain source tree (here: `scripts/prepare-bench-tree.sh
# <commit>` extracts one under .device/trees/, which the device tool carries with .device);
# it is built in its own build-gpu with this tree's .device/third_party. The tables go to
# $OUT/summary.txt, headed by the tree and round; each run is killed after
# BENCH_TREES_TIMEOUT seconds (default 120).
set -uo pipefail
O=${OUT:-$PWD/out}
mkdir -p "$O"
root=$PWD
SUMMARY="$O/summary.txt"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > "$SUMMARY" 2>&1
trees=". ${BENCH_TREES:?BENCH_TREES: the source trees to compare with this one}"
for tree in $trees; do
  name=$(basename "$(cd "$tree" && pwd)")
  mkdir -p "$O/build-$name"
  (cd "$tree" && OUT="$O/build-$name" CSATTN_THIRD_PARTY_DIR="$root/.device/third_party" \
     bash -c 'source scripts/device-build.sh') || { echo "build of $tree failed"; exit 1; }
done
rc=0
for round in $(seq "${BENCH_ROUNDS:-2}"); do
  for tree in $trees; do
    name=$(basename "$(cd "$tree" && pwd)")
    echo "== $name, round $round" | tee -a "$SUMMARY"
    (cd "$tree" && timeout -s KILL "${BENCH_TREES_TIMEOUT:-120}" build-gpu/csattn bench --device cuda \
       --out /dev/null 2>> "$O/bench.err") | tee -a "$SUMMARY"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  done
done
rm -rf "$O"/build-*/build.log
echo "gpu-bench-trees: rc $rc, $SECONDS s"
exit $rc
