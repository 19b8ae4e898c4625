#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root, in one call: the
# verification of the tenth and eleventh sessions' device-less work (design.md "What comes
# next", steps 2 and 3).
#   1. scripts/gpu-check.sh into $OUT/c: the whole suite, `csattn run --device cuda`, and the
#      layer (16K, 64K), deterministic, elementwise and indexer_loss sections;
#   2. with the time left (the call's limit is 600 s; VERIFY_BUDGET_S, default 580), the
#      indexer loss tests and the indexer_loss section again with CSATTN_INDEXER_TEACHER=mma
#      (the rows kernel's teacher) into $OUT/t - the A/B of the wgmma teacher.
# Here, first: scripts/prepare-device-deps.sh; call the device tool with carry: [".device"].
# At most 8 files come back: the helper files the two steps do not need are removed.
set -uo pipefail
O=${OUT:-$PWD/out}
budget=${VERIFY_BUDGET_S:-580}
OUT=$O/c GPU_CHECK_TORCH=0 CSATTN_BENCH_SECTIONS=layer,deterministic,elementwise,indexer_loss \
  CSATTN_BENCH_LAYER_TOKENS=${CSATTN_BENCH_LAYER_TOKENS:-16384,65536} bash scripts/gpu-check.sh
rm -f "$O/c/cuda_bench.svg" "$O/c/report.json"
left=$(( budget - SECONDS ))
echo "== $left s left for the teacher A/B"
if [ "$left" -gt 60 ]; then
  OUT=$O/t COMPARE_FILTER='*CudaIndexerLoss*' COMPARE_TESTS_PER_VALUE=1 COMPARE_VAR=CSATTN_INDEXER_TEACHER \
    COMPARE_VALUES=mma CSATTN_BENCH_SECTIONS=indexer_loss COMPARE_TEST_TIMEOUT=$(( left / 2 )) \
    COMPARE_BENCH_TIMEOUT=$(( left / 2 - 10 )) bash scripts/gpu-compare.sh
  cat "$O/t/bench.err" >> "$O/t/summary.txt" 2>/dev/null
  rm -f "$O/t/build.log" "$O/t/bench.err"
else
  echo "no time left: run the A/B in a call of its own (design.md)"
fi
