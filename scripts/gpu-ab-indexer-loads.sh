#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root: the A/B of the wgmma
# indexer's key-tile loads, CSATTN_INDEXER_LOADS=tma (TMA, a candidate written 2026-12-06)
# against the default (cp.async), in one call:
#   1. the indexer, forward, MXFP8, CP and graph tests with CSATTN_INDEXER_LOADS=tma (the
#      default path's tests passed in the whole suite on 930e066), killed after 150 s;
#   2. the `indexer` section once per value (gpu-compare.sh), each killed after 100 s.
# Everything under $OUT/loads. Remove this script once the A/B is decided.
# Here, first: scripts/prepare-device-deps.sh; call the device tool with carry: [".device"].
set -uo pipefail
O=${OUT:-$PWD/out}/loads
mkdir -p "$O"
OUT=$O COMPARE_FILTER='Shapes/CudaIndexer.*:CudaIndexerLong.*:*CudaForward*:*CudaMxfp8*:*CudaCp*:*DeviceLayerGraph*CSA*' \
  COMPARE_TESTS_PER_VALUE=1 COMPARE_TEST_TIMEOUT=150 COMPARE_VAR=CSATTN_INDEXER_LOADS COMPARE_VALUES="tma" \
  COMPARE_BENCH=0 bash scripts/gpu-compare.sh
OUT=$O COMPARE_VAR=CSATTN_INDEXER_LOADS COMPARE_VALUES="default tma" CSATTN_BENCH_SECTIONS=indexer \
  COMPARE_BENCH_TIMEOUT=100 bash scripts/gpu-compare.sh
rm -f "$O"/build.log "$O"/bench_*.json
echo "gpu-ab-indexer-loads: $SECONDS s"
