#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root: the A/B of
# gpu-bench-trees.sh (this tree against BENCH_TREES, alternately, BENCH_ROUNDS rounds of
# CSATTN_BENCH_SECTIONS) with the card's SM clock, power draw and temperature sampled every
# 50 ms (nvidia-smi) into $OUT/clocks.csv and each run's start and end time in
# $OUT/summary.txt, so that a kernel that takes fewer cycles but more time can be told apart
# from one that lowers the clock (power or thermal limit).
#   BENCH_TREES=.device/trees/f5d0859 CSATTN_BENCH_SECTIONS=attention bash scripts/gpu-bench-clocks.sh
set -uo pipefail
O=${OUT:-$PWD/out}
mkdir -p "$O"
# Builds only (zero rounds): each tree into its own build-gpu.
BENCH_ROUNDS=0 OUT="$O/build" bash scripts/gpu-bench-trees.sh > "$O/build.txt" 2>&1 || { tail -20 "$O/build.txt"; exit 1; }
SUMMARY="$O/summary.txt"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > "$SUMMARY" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 50 \
  > "$O/clocks.csv" 2>&1 &
sampler=$!
rc=0
for round in $(seq "${BENCH_ROUNDS:-2}"); do
  for tree in . ${BENCH_TREES:?BENCH_TREES: the source trees to compare with this one}; do
    name=$(basename "$(cd "$tree" && pwd)")
    echo "== $name, round $round, start $(date +%Y/%m/%d\ %T.%3N)" | tee -a "$SUMMARY"
    (cd "$tree" && timeout -s KILL "${BENCH_TREES_TIMEOUT:-120}" build-gpu/csattn bench --device cuda \
       --out /dev/null 2>> "$O/bench.err") | tee -a "$SUMMARY"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    echo "== $name, round $round, end $(date +%Y/%m/%d\ %T.%3N)" | tee -a "$SUMMARY"
  done
done
kill "$sampler" 2>/dev/null
echo "gpu-bench-clocks: rc $rc, $SECONDS s"
exit $rc
