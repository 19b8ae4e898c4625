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
if has r; then
  mkdir -p "$O/r"
  OUT=$O/r COMPARE_FILTER='*CudaAttentionBackward*:*CudaBackward*:*CudaDeviceLayer.*:Layers/CudaCp.*' \
    COMPARE_TESTS_PER_VALUE=1 COMPARE_TEST_TIMEOUT=120 COMPARE_VAR=CSATTN_BWD_TILE_ORDER \
    COMPARE_VALUES="rotated" COMPARE_BENCH=0 bash scripts/gpu-compare.sh
  OUT=$O/r COMPARE_VAR=CSATTN_BWD_TILE_ORDER COMPARE_VALUES="default rotated" \
    CSATTN_BENCH_SECTIONS=attention_backward COMPARE_BENCH_TIMEOUT=45 bash scripts/gpu-compare.sh
fi
if has l; then
  mkdir -p "$O/l"
  OUT=$O/l COMPARE_FILTER='*CudaIndexerLoss*:*CudaBackward*:*CudaCp*:*CudaMxfp8*' \
    COMPARE_TESTS_PER_VALUE=1 COMPARE_TEST_TIMEOUT=120 COMPARE_VAR=CSATTN_LOSS_DK_FLUSH \
    COMPARE_VALUES="lines" COMPARE_BENCH=0 bash scripts/gpu-compare.sh
  OUT=$O/l COMPARE_VAR=CSATTN_LOSS_DK_FLUSH COMPARE_VALUES="default lines" \
    CSATTN_BENCH_SECTIONS=indexer_loss COMPARE_BENCH_TIMEOUT=80 bash scripts/gpu-compare.sh
fi
if has p; then
  mkdir -p "$O/p"
  OUT=$O/p COMPARE_FILTER='*CudaIndexerLoss*:*CudaForward*:*CudaBackward*:*CudaDeviceLayer*:*CudaCp*:*CudaMxfp8*' \
    COMPARE_TESTS_PER_VALUE=1 COMPARE_TEST_TIMEOUT=200 COMPARE_VAR=CSATTN_LOSS_PREDICTOR \
    COMPARE_VALUES="indexer" COMPARE_BENCH=0 bash scripts/gpu-compare.sh
  OUT=$O/p COMPARE_VAR=CSATTN_LOSS_PREDICTOR COMPARE_VALUES="default indexer" CSATTN_BENCH_SECTIONS=layer \
    CSATTN_BENCH_LAYER_TOKENS=16384,65536 COMPARE_BENCH_TIMEOUT=120 bash scripts/gpu-compare.sh
fi
rm -f "$O"/*/build.log "$O"/*/bench_*.json
echo "gpu-ab-fourteenth: $SECONDS s"
