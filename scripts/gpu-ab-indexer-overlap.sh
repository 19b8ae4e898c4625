#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root: the A/B of the
# overlapped wgmma indexer (CSATTN_INDEXER=overlap, indexer_topk_wgmma_overlap.cu; written in
# the fifteenth session without a device), one call of at most ~9 minutes (a 45 s build,
# tests <= 300 s, 2 benchmark runs <= 100 s each):
#   tests/  the indexer tests (they run the overlapped kernel directly, without the
#           variable), then the forward, loss, device-layer, MXFP8, CP and graph tests with
#           CSATTN_INDEXER=overlap (the layer's selection through it, its scores into the loss);
#   bench/  the `indexer` and `layer` (64K tokens) sections once per value (default, overlap):
#           compare "indexer + top-k" and the CSA forward's "indexer top-k" stage.
# A hang (a barrier hand-over gone wrong) is killed by the step's timeout. Keep the winner
# as the only path (the two-warpgroup kernel then stays for the phase stamps, or goes).
# Here, first: scripts/prepare-device-deps.sh; call the device tool with carry: [".device"].
set -uo pipefail
O=${OUT:-$PWD/out}
mkdir -p "$O/tests" "$O/bench"
rc=0
OUT=$O/tests COMPARE_FILTER='*CudaIndexer*:*CudaForward*:*CudaIndexerLoss*:*CudaDeviceLayer*:*CudaMxfp8*:*CudaCp*:*CudaGraph*' \
  COMPARE_TESTS_PER_VALUE=1 COMPARE_VAR=CSATTN_INDEXER COMPARE_VALUES=overlap COMPARE_TEST_TIMEOUT=300 \
  COMPARE_BENCH=0 bash scripts/gpu-compare.sh || rc=1
OUT=$O/bench COMPARE_VAR=CSATTN_INDEXER COMPARE_VALUES="default overlap" CSATTN_BENCH_SECTIONS=indexer,layer \
  CSATTN_BENCH_LAYER_TOKENS=65536 COMPARE_BENCH_TIMEOUT=100 bash scripts/gpu-compare.sh || rc=1
rm -f "$O"/*/build.log "$O"/*/bench_*.json
echo "gpu-ab-indexer-overlap: rc $rc, $SECONDS s"
exit $rc
