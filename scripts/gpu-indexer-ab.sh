#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root: the indexer's
# candidates against the default in one build and one call. First scripts/gpu-compare.sh with
# CSATTN_INDEXER_SELECT=block|rows (the tests of INDEXER_AB_FILTER once, the `indexer` section
# per value), then every indexer and forward test with both candidates on
# (CSATTN_INDEXER_SELECT=rows CSATTN_INDEXER_SUMS=scatter), the `indexer` section with the
# reduce-scatter sums alone, and the indexer, layer and reductions sections with both.
# Here, first: scripts/prepare-device-deps.sh; call the device tool with carry: [".device"].
set -uo pipefail
O=${OUT:-$PWD/out}
mkdir -p "$O"
OUT=$O COMPARE_FILTER=${INDEXER_AB_FILTER:-'CpCli.*:*CudaAttentionForward*:*Stamps*:*CudaIndexer*:*CudaForward*'} \
  COMPARE_VAR=CSATTN_INDEXER_SELECT COMPARE_VALUES="block rows" CSATTN_BENCH_SECTIONS=indexer \
  bash scripts/gpu-compare.sh
rm -f "$O/build.log"  # at most 8 files come back
echo "== tests with both candidates on"
CSATTN_INDEXER_SELECT=rows CSATTN_INDEXER_SUMS=scatter timeout -s KILL 240 build-gpu/tests/csattn_tests \
  --gtest_filter='*CudaIndexer*:*CudaForward*:*Mxfp8*' > "$O/cand_tests.log" 2>&1
echo "candidate tests: status $?"
grep -E "^\[  (FAILED|PASSED) |Failure" "$O/cand_tests.log" | head -20
{
  echo "== bench indexer: CSATTN_INDEXER_SUMS=scatter alone"
  CSATTN_INDEXER_SUMS=scatter timeout -s KILL 200 build-gpu/csattn bench --device cuda --sections indexer \
    --out /tmp/scatter.json 2>/dev/null
  echo "== bench indexer, layer, reductions: both candidates"
  CSATTN_INDEXER_SELECT=rows CSATTN_INDEXER_SUMS=scatter CSATTN_BENCH_LAYER_TOKENS=${INDEXER_AB_LAYER_TOKENS:-65536} \
    timeout -s KILL 300 build-gpu/csattn bench --device cuda --sections indexer,layer,reductions \
    --out "$O/both.json" 2>/dev/null
} > "$O/cand_bench.txt"
cat "$O/cand_bench.txt"
