#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root: what the thirteenth
# session left to measure, in one call, in priority order, each step skipped when the call's
# time (AB_BUDGET_S, default 570 s) cannot hold it:
#   d/ the tests of this session's changes through ctest, 8 at a time (the key-stationary
#      pass's kernel, layer, graph and CP tests - its new warp mapping; the indexer loss with
#      the wgmma teacher as its only path), then CSATTN_HCA_DET_GRADS=default|scratch - the
#      deterministic HCA backward's compressed rows key-stationary or on the per-(row, slot)
#      scratch: the deterministic section per value;
#   a/ CSATTN_DK_FLUSH=fragments|lines - the attention backward tests with `lines` (the default
#      passed the whole suite), then the attention_backward section per value;
#   b/ CSATTN_INDEXER_SELECT=default|shared - the indexer and forward tests with `shared`, then
#      the indexer section per value.
# Each part's summary.txt (and tests.log / ctest.log) come back under $OUT/<part>.
# Here, first: scripts/prepare-device-deps.sh; call the device tool with carry: [".device"].
set -uo pipefail
O=${OUT:-$PWD/out}
budget=${AB_BUDGET_S:-570}
left() { echo $(( budget - SECONDS )); }
mkdir -p "$O/d"
( OUT=$O/d; source scripts/device-build.sh ) || exit 1
echo "== ctest: this session's changes"
ctest --test-dir build-gpu -j 8 --timeout 200 --output-on-failure \
  -R 'ratio128|CudaAttentionBackwardLong|CudaIndexerLoss|CudaCp.Deterministic|CudaDeterministic.*HCA|CudaDeviceLayerGraph.*HCA|CudaLayerMemory' \
  > "$O/d/ctest.log" 2>&1
grep -E "tests passed|\*\*\*Failed|Failure|Skipped" "$O/d/ctest.log" | head -20
OUT=$O/d COMPARE_VAR=CSATTN_HCA_DET_GRADS COMPARE_VALUES="default scratch" \
  CSATTN_BENCH_SECTIONS=deterministic COMPARE_BENCH_TIMEOUT=130 bash scripts/gpu-compare.sh
echo "== $(left) s left for the dK flush A/B"
if [ "$(left)" -gt 200 ]; then
  OUT=$O/a COMPARE_FILTER='*CudaAttentionBackward*:Layers/CudaDeterministic*small*:Layers/CudaBackward*-*long4200*' \
    COMPARE_TESTS_PER_VALUE=1 COMPARE_TEST_TIMEOUT=110 COMPARE_VAR=CSATTN_DK_FLUSH \
    COMPARE_VALUES="lines" CSATTN_BENCH_SECTIONS=attention_backward COMPARE_BENCH_TIMEOUT=1 \
    bash scripts/gpu-compare.sh > /dev/null
  OUT=$O/a COMPARE_VAR=CSATTN_DK_FLUSH COMPARE_VALUES="fragments lines" \
    CSATTN_BENCH_SECTIONS=attention_backward COMPARE_BENCH_TIMEOUT=80 bash scripts/gpu-compare.sh
fi
echo "== $(left) s left for the indexer select A/B"
if [ "$(left)" -gt 150 ]; then
  OUT=$O/b COMPARE_FILTER='Shapes/CudaIndexer.*:CudaIndexerLong.*:*CudaForward*' \
    COMPARE_TESTS_PER_VALUE=1 COMPARE_TEST_TIMEOUT=80 COMPARE_VAR=CSATTN_INDEXER_SELECT \
    COMPARE_VALUES="shared" CSATTN_BENCH_SECTIONS=indexer COMPARE_BENCH_TIMEOUT=1 \
    bash scripts/gpu-compare.sh > /dev/null
  t=$(( ($(left) - 10) / 2 )); [ "$t" -gt 90 ] && t=90
  OUT=$O/b COMPARE_VAR=CSATTN_INDEXER_SELECT COMPARE_VALUES="default shared" \
    CSATTN_BENCH_SECTIONS=indexer COMPARE_BENCH_TIMEOUT=$t bash scripts/gpu-compare.sh
fi
rm -f "$O"/*/build.log "$O"/*/bench_*.json
for p in a b; do [ -f "$O/$p/tests.log" ] && grep -E "^== tests|^\[  (FAILED|PASSED|SKIPPED) |Failure" "$O/$p/tests.log" | head -30; done
echo "gpu-ab-thirteenth: $SECONDS s"
