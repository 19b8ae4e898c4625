#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root: the A/B runs of the
# candidates written without a device, in one build and one call (about 8 minutes):
#   a/ CSATTN_DK_FLUSH=fragments|lines - the attention backward's key-gradient flush
#      (flush_dk_lines): the backward tests once per value, then the attention_backward
#      section (phase table included) per value, and the reductions section once;
#   b/ CSATTN_INDEXER_SELECT=default|shared - the indexer's select from shared memory: the
#      indexer and forward tests once per value, then the indexer section (phase table) per value.
# Each part's summary.txt and tests.log come back under $OUT/a and $OUT/b (the build logs and
# the JSON reports are dropped: at most 8 files come back). After it: keep each winner as the
# only code, delete its switch, its README line and this script (docs/design.md).
# Here, first: scripts/prepare-device-deps.sh; call the device tool with carry: [".device"].
set -uo pipefail
O=${OUT:-$PWD/out}
mkdir -p "$O/a" "$O/b"
# The backward tests without the two slow long-row cases (the CUDA-core reference takes
# ~150 s for them) and the 128-head deterministic layers: what fits two runs in the call.
OUT=$O/a COMPARE_FILTER='*CudaAttentionBackward*:Layers/CudaDeterministic*small*:Layers/CudaDeterministic*flash_CSA_sparse:Layers/CudaBackward*-*long4200*' \
  COMPARE_TESTS_PER_VALUE=1 COMPARE_TEST_TIMEOUT=150 COMPARE_VAR=CSATTN_DK_FLUSH \
  COMPARE_VALUES="fragments lines" CSATTN_BENCH_SECTIONS=attention_backward \
  COMPARE_BENCH_TIMEOUT=120 bash scripts/gpu-compare.sh
a=$?
OUT=$O/b COMPARE_FILTER='Shapes/CudaIndexer.*:CudaIndexerLong.*:*CudaForward*' \
  COMPARE_TESTS_PER_VALUE=1 COMPARE_TEST_TIMEOUT=120 COMPARE_VAR=CSATTN_INDEXER_SELECT \
  COMPARE_VALUES="default shared" CSATTN_BENCH_SECTIONS=indexer COMPARE_BENCH_TIMEOUT=120 \
  bash scripts/gpu-compare.sh
b=$?
echo "== bench: reductions (independent of both variables)" | tee -a "$O/a/summary.txt"
timeout -s KILL 120 build-gpu/csattn bench --device cuda --sections reductions --out /tmp/reductions.json \
  2>> "$O/a/bench.err" | tee -a "$O/a/summary.txt"
rm -f "$O"/a/build.log "$O"/b/build.log "$O"/a/bench_*.json "$O"/b/bench_*.json
echo "gpu-candidates: dK flush A/B rc $a, indexer select A/B rc $b"
