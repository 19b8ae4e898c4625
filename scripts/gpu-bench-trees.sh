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
# BENCH_TREES_TIMEOUT seconds (default 120). BENCH_CLOCKS=1 also samples the card's SM clock,
# power draw and temperature every 50 ms (nvidia-smi) into $OUT/clocks.csv and puts each
# run's start and end time in the summary, so that a kernel taking fewer cycles but more
# time can be told apart from one that lowers the clock (power or thermal limit).
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
sampler=
if [ "${BENCH_CLOCKS:-0}" = 1 ]; then
  nvidia-smi --query-gpu=power.limit,clocks.max.sm --format=csv >> "$SUMMARY" 2>&1
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 50 \
    > "$O/clocks.csv" 2>&1 &
  sampler=$!
fi
stamp() { [ -n "$sampler" ] && echo ", $1 $(date '+%Y/%m/%d %T.%3N')"; }
rc=0
for round in $(seq "${BENCH_ROUNDS:-2}"); do
  for tree in $trees; do
    name=$(basename "$(cd "$tree" && pwd)")
    echo "== $name, round $round$(stamp start)" | tee -a "$SUMMARY"
    (cd "$tree" && timeout -s KILL "${BENCH_TREES_TIMEOUT:-120}" build-gpu/csattn bench --device cuda \
       --out /dev/null 2>> "$O/bench.err") | tee -a "$SUMMARY"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    [ -n "$sampler" ] && echo "== $name, round $round$(stamp end)" | tee -a "$SUMMARY"
  done
done
[ -n "$sampler" ] && kill "$sampler" 2>/dev/null
rm -rf "$O"/build-*/build.log
echo "gpu-bench-trees: rc $rc, $SECONDS s"
exit $rc
