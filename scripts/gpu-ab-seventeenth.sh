#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root: the seventeenth
# session's candidate, the indexer loss's gradient-only instance (indexer_loss_mma.cu
# kGradOnly, launched with kKeptGradients by the layer's backward: two CTAs an SM), under $OUT:
#   t/: the loss, backward, deterministic, CP, MXFP8, graph and device-layer tests (ctest -j 8);
#   b/: the `indexer_loss` and `layer` sections (16K and 64K tokens) on this tree and on the
#       tree before it (.device/trees/$AB_BASE, default 1a89940), built apart, run alternately.
# Here, first: scripts/prepare-device-deps.sh and scripts/prepare-bench-tree.sh 1a89940; call
# the device tool with carry: [".device"]. Goes once the candidate is decided.
set -uo pipefail
O=${OUT:-$PWD/out}
mkdir -p "$O/t" "$O/b"
rc=0
OUT=$O/t
source scripts/device-build.sh
echo "== tests"
ctest --test-dir build-gpu -j 8 --timeout 300 --output-on-failure \
  -R 'CudaIndexerLoss|CudaBackward|CudaDeterministic|CudaCp|CudaMxfp8|CudaGraph|CudaDeviceLayer|CudaLayerMemory' \
  > "$O/t/ctest.log" 2>&1 || rc=1
grep -E "tests passed|Failed|\*\*\*" "$O/t/ctest.log" | grep -v "Passed" | tail -30
rm -f "$O/t/build.log"
OUT=$O/b BENCH_TREES=.device/trees/${AB_BASE:-1a89940} BENCH_ROUNDS=1 BENCH_TREES_TIMEOUT=200 \
  CSATTN_BENCH_SECTIONS=indexer_loss,layer CSATTN_BENCH_LAYER_TOKENS=16384,65536 \
  bash scripts/gpu-bench-trees.sh || rc=1
echo "gpu-ab-seventeenth: rc $rc, $SECONDS s"
exit $rc
