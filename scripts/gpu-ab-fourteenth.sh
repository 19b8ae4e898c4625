#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root: the A/Bs of the two
# candidates the fourteenth session wrote without a device, the parts of AB_PARTS (default
# "r l") in that order, each under $OUT/<part>:
#   r/ CSATTN_BWD_TILE_ORDER=rotated - the attention backward's fast mode starts each CTA's
#      key tiles at the phase the running CTAs have reached, so their dK reductions share
#      the same ~1/tiles of the keys in L2 (attention_backward_wgmma.cu): the attention
#      backward, layer backward, device-layer and CP tests with it (fast mode), then the `attention_backward`
#      section per value (the rows at 32K-64K keys are the ones it should move);
#   l/ CSATTN_LOSS_DK_FLUSH=lines - the tensor-core indexer loss's dK^I by whole 128-byte
#      lines (add_key_grads_lines): the loss, backward, CP and MXFP8 tests with it, then the
#      `indexer_loss` section per value (its "gradient launch" rows);
#   p/ (only when listed) CSATTN_LOSS_PREDICTOR=indexer - the sparse loss's value launch takes
#      its predictor logits from the indexer's selected scores (forward.cpp): the loss,
#      forward, backward, device-layer, CP and MXFP8 tests with it, then the `layer` section
#      per value (compare the CSA forward's total: the score stores land in "indexer top-k",
#      the saving in "indexer loss"; Flash shape only, so the 128-head teacher's masses-only
#      memset is not timed).
# The default parts r and l fit one 600 s call: at most 65 s of build + 120 + 2 x 45 (r) +
# 120 + 2 x 80 (l); p is a call of its own (AB_PARTS=p).
# Keep each winner as the only path (its switch, README line and this script go).
# Here, first: scripts/prepare-device-deps.sh; call the device tool with carry: [".device"].
set -uo pipefail
O=${OUT:-$PWD/out}
parts=" ${AB_PARTS:-r l} "
has() { [[ "$parts" == *" $1 "* ]]; }
# One part: ab_part <dir> <variable> <candidate value> <gtest filter> <test timeout> <bench
# timeout> <sections> [VAR=value ...for the benchmark]: the tests once with the candidate, then
# the sections once per value (default, candidate), all under $O/<dir>.
ab_part() {
  local dir=$1 var=$2 value=$3 filter=$4 test_timeout=$5 bench_timeout=$6 sections=$7
  shift 7
  mkdir -p "$O/$dir"
  OUT=$O/$dir COMPARE_FILTER=$filter COMPARE_TESTS_PER_VALUE=1 COMPARE_TEST_TIMEOUT=$test_timeout \
    COMPARE_VAR=$var COMPARE_VALUES=$value COMPARE_BENCH=0 bash scripts/gpu-compare.sh
  env "$@" OUT="$O/$dir" COMPARE_VAR="$var" COMPARE_VALUES="default $value" CSATTN_BENCH_SECTIONS="$sections" \
    COMPARE_BENCH_TIMEOUT="$bench_timeout" bash scripts/gpu-compare.sh
}
has r && ab_part r CSATTN_BWD_TILE_ORDER rotated \
  '*CudaAttentionBackward*:*CudaBackward*:*CudaDeviceLayer.*:Layers/CudaCp.*' 120 45 attention_backward
has l && ab_part l CSATTN_LOSS_DK_FLUSH lines '*CudaIndexerLoss*:*CudaBackward*:*CudaCp*:*CudaMxfp8*' 120 80 indexer_loss
has p && ab_part p CSATTN_LOSS_PREDICTOR indexer \
  '*CudaIndexerLoss*:*CudaForward*:*CudaBackward*:*CudaDeviceLayer*:*CudaCp*:*CudaMxfp8*' 200 120 layer \
  CSATTN_BENCH_LAYER_TOKENS=16384,65536
rm -f "$O"/*/build.log "$O"/*/bench_*.json
echo "gpu-ab-fourteenth: $SECONDS s"
