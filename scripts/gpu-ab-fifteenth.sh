#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root: the A/Bs of the two
# candidates the fifteenth session wrote without a device, the parts of AB_PARTS (default
# "o"; each part is one call of at most ~9 minutes: a 45 s build, tests <= 300 s, two
# benchmark runs <= 100 s each), each under $OUT/<part>:
#   o/ CSATTN_INDEXER=overlap - the wgmma indexer with a third warpgroup selecting one block
#      while the other two score the next (indexer_topk_wgmma_overlap.cu): the indexer tests
#      (they run it directly, without the variable), the forward, loss, device-layer, MXFP8,
#      CP and graph tests with the variable; then the `indexer` and `layer` (64K) sections
#      per value (compare "indexer + top-k" and the CSA forward's "indexer top-k" stage);
#   l/ CSATTN_INDEXER_LOSS=light - the sparse loss's value launch forms the KL of its rows
#      with given masses and logits by one warp from `kept` (indexer_loss_mma.cu,
#      kGivenLight): the loss tests (LightRowsTakeTheirKlFromKept runs it directly), the
#      forward, backward, device-layer, CP and MXFP8 tests with the variable; then the
#      `layer` section at 16K / 64K per value (compare the CSA forward's "indexer loss").
# A hang is killed by the step's timeout. Keep each winner as the only path (its switch,
# README line and this script's part go).
# Here, first: scripts/prepare-device-deps.sh; call the device tool with carry: [".device"].
set -uo pipefail
O=${OUT:-$PWD/out}
parts=" ${AB_PARTS:-l} "
has() { [[ "$parts" == *" $1 "* ]]; }
rc=0
# ab_part <dir> <variable> <candidate value> <gtest filter> <sections> [VAR=value ...for the
# benchmark]: the tests once with the candidate, then the sections once per value.
ab_part() {
  local dir=$1 var=$2 value=$3 filter=$4 sections=$5
  shift 5
  mkdir -p "$O/$dir"
  OUT=$O/$dir COMPARE_FILTER=$filter COMPARE_TESTS_PER_VALUE=1 COMPARE_TEST_TIMEOUT=300 \
    COMPARE_VAR=$var COMPARE_VALUES=$value COMPARE_BENCH=0 bash scripts/gpu-compare.sh || rc=1
  env "$@" OUT="$O/$dir" COMPARE_VAR="$var" COMPARE_VALUES="default $value" CSATTN_BENCH_SECTIONS="$sections" \
    COMPARE_BENCH_TIMEOUT=100 bash scripts/gpu-compare.sh || rc=1
}
has o && ab_part o CSATTN_INDEXER overlap \
  '*CudaIndexer*:*CudaForward*:*CudaIndexerLoss*:*CudaDeviceLayer*:*CudaMxfp8*:*CudaCp*:*CudaGraph*' indexer,layer \
  CSATTN_BENCH_LAYER_TOKENS=65536
has l && ab_part l CSATTN_INDEXER_LOSS light \
  '*CudaIndexerLoss*:*CudaForward*:*CudaBackward*:*CudaDeviceLayer*:*CudaCp*:*CudaMxfp8*' layer \
  CSATTN_BENCH_LAYER_TOKENS=16384,65536
rm -f "$O"/*/build.log "$O"/*/bench_*.json
echo "gpu-ab-fifteenth: rc $rc, $SECONDS s"
exit $rc
