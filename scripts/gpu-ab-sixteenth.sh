#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root: the A/B of the
# candidate the sixteenth session wrote without a device, under $OUT/c:
#   CSATTN_INDEXER=overlap_compact - the overlapped wgmma indexer whose selecting warps keep
#   the first radix digit's bin in shared memory and count the third digit from there
#   (indexer_topk_wgmma_overlap.cu kCompact, idxsel::digit1_histogram_keeping): the indexer
#   tests (they run it directly, IndexerKernel::wgmma_overlap_compact), then the forward and
#   device-layer tests with the variable (~4 minutes with the build); then the `indexer`
#   section per value (the overlapped kernel's totals are printed for the value's kernel:
#   compare the selecting warps' "digit2" and the scoring side's "ticket + free wait").
# A hang is killed by the step's timeout. Keep the winner as the only path (its switch, enum
# value, README line and this script go).
# Here, first: scripts/prepare-device-deps.sh; call the device tool with carry: [".device"].
set -uo pipefail
O=${OUT:-$PWD/out}/c
mkdir -p "$O"
rc=0
OUT=$O COMPARE_FILTER='*CudaIndexer*:*CudaForward*:*CudaDeviceLayer*' COMPARE_TESTS_PER_VALUE=1 \
  COMPARE_TEST_TIMEOUT=240 COMPARE_VAR=CSATTN_INDEXER COMPARE_VALUES=overlap_compact COMPARE_BENCH=0 \
  bash scripts/gpu-compare.sh || rc=1
OUT=$O COMPARE_VAR=CSATTN_INDEXER COMPARE_VALUES="default overlap_compact" CSATTN_BENCH_SECTIONS=indexer \
  COMPARE_BENCH_TIMEOUT=90 bash scripts/gpu-compare.sh || rc=1
rm -f "$O"/build.log "$O"/bench_*.json
echo "gpu-ab-sixteenth: rc $rc, $SECONDS s"
exit $rc
