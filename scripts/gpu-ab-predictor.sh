#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root: the A/B of the last
# pending candidate, CSATTN_LOSS_PREDICTOR=indexer (the sparse loss's value launch takes its
# predictor logits from the indexer's selected scores, forward.cpp), in one call:
#   1. the whole suite (gpu-check.sh's ctest -j 8) with the candidate on, so that if it wins,
#      the state it becomes has run whole (status and logs under $OUT/suite);
#   2. the `layer` section at 16K / 64K tokens once per value (default, indexer) under
#      $OUT/bench: compare the CSA forward's total (the score stores land in "indexer
#      top-k", the saving in "indexer loss"; Flash shape only, so the 128-head teacher's
#      masses-only memset is not timed).
# About 65 s of build + ~240 s of suite + 2 x at most 120 s. Keep the winner as the only
# path (its switch, README line and this script go).
# Here, first: scripts/prepare-device-deps.sh; call the device tool with carry: [".device"].
set -uo pipefail
O=${OUT:-$PWD/out}
mkdir -p "$O/suite" "$O/bench"
rc=0
CSATTN_LOSS_PREDICTOR=indexer OUT=$O/suite GPU_CHECK_BENCH=0 GPU_CHECK_RUN=0 bash scripts/gpu-check.sh || rc=1
OUT=$O/bench COMPARE_VAR=CSATTN_LOSS_PREDICTOR COMPARE_VALUES="default indexer" CSATTN_BENCH_SECTIONS=layer \
  CSATTN_BENCH_LAYER_TOKENS=16384,65536 COMPARE_BENCH_TIMEOUT=120 bash scripts/gpu-compare.sh || rc=1
rm -f "$O"/*/build.log "$O"/*/bench_*.json
echo "gpu-ab-predictor: rc $rc, $SECONDS s"
exit $rc
