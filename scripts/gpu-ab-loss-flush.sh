#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root: the A/B of the
# tensor-core indexer loss's key-gradient flush, CSATTN_LOSS_DK_FLUSH=lines (whole 128-byte
# lines through shared memory, add_key_grads_lines; a candidate written 2026-12-06 without a
# device) against the default (float2 atomics in the MMA fragment layout), in one call:
#   1. the indexer-loss, backward and CP tests with CSATTN_LOSS_DK_FLUSH=lines, killed after
#      200 s;
#   2. the `indexer_loss` section once per value (its "gradient launch" rows are the kernel
#      this changes), each killed after 120 s.
# Everything under $OUT/loss. Remove this script once the A/B is decided (keep the winner as
# the only path).
# Here, first: scripts/prepare-device-deps.sh; call the device tool with carry: [".device"].
set -uo pipefail
O=${OUT:-$PWD/out}/loss
mkdir -p "$O"
OUT=$O COMPARE_FILTER='*CudaIndexerLoss*:Layers/CudaBackward*:*CudaCp*:*CudaMxfp8*' \
  COMPARE_TESTS_PER_VALUE=1 COMPARE_TEST_TIMEOUT=200 COMPARE_VAR=CSATTN_LOSS_DK_FLUSH COMPARE_VALUES="lines" \
  COMPARE_BENCH=0 bash scripts/gpu-compare.sh
OUT=$O COMPARE_VAR=CSATTN_LOSS_DK_FLUSH COMPARE_VALUES="default lines" CSATTN_BENCH_SECTIONS=indexer_loss \
  COMPARE_BENCH_TIMEOUT=120 bash scripts/gpu-compare.sh
rm -f "$O"/build.log "$O"/bench_*.json
echo "gpu-ab-loss-flush: $SECONDS s"
