#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root: the A/B runs the
# thirteenth session left, in one call, the parts of AB_PARTS (default "d a b") in that order;
# t and d always run (each step under its own timeout), a and b are skipped when the call's
# time left (AB_BUDGET_S, default 570 s) cannot hold them:
#   t/ (only when listed) the key-stationary pass's kernel, layer, graph, memory and CP tests
#      through ctest, 8 at a time, with CSATTN_HCA_DET_GRADS=wgmma, so that the layer-level
#      tests take its wgmma kernel (written without a device; the kernel-level tests run both
#      kernels whatever the variable says; the default mma.sync kernel passed them all on an
#      H100 on 2026-12-06);
#   d/ CSATTN_HCA_DET_GRADS=default|wgmma|scratch - the deterministic HCA backward's compressed
#      rows key-stationary on mma.sync or on wgmma, or on the per-(row, slot) scratch: the
#      deterministic section's HCA rows at 16K and 128K tokens (CSATTN_BENCH_DET_TOKENS /
#      _RATIOS), per value;
#   a/ CSATTN_DK_FLUSH=fragments|lines - the attention backward tests with `lines` (the default
#      passed the whole suite), then the attention_backward section per value, then the
#      reductions section once (what each flush layout can reach) with the time left;
#   b/ CSATTN_INDEXER_SELECT=default|shared - the indexer section per value (its tests passed
#      with `shared` on an H100 on 2026-12-06).
# Each part's summary.txt (and tests.log / ctest.log) come back under $OUT/<part>. A 600 s call
# holds about "t d", "a" or "b" (the H100 took > 130 s for the whole deterministic section and
# > 76 s for the indexer section): the next session's calls are AB_PARTS="t d", then a, then b.
# Here, first: scripts/prepare-device-deps.sh; call the device tool with carry: [".device"].
set -uo pipefail
O=${OUT:-$PWD/out}
budget=${AB_BUDGET_S:-570}
parts=" ${AB_PARTS:-d a b} "
left() { echo $(( budget - SECONDS )); }
has() { [[ "$parts" == *" $1 "* ]]; }
mkdir -p "$O/t"
( OUT=$O/t; source scripts/device-build.sh ) || exit 1
if has t; then
  echo "== ctest: the keyed pass's tests with CSATTN_HCA_DET_GRADS=wgmma"
  CSATTN_HCA_DET_GRADS=wgmma ctest --test-dir build-gpu -j 8 --timeout 200 --output-on-failure \
    -R 'ratio128|CudaAttentionBackwardLong|CudaCp.Deterministic|CudaDeterministic.*HCA|CudaDeviceLayerGraph.*HCA|CudaLayerMemory' \
    > "$O/t/ctest.log" 2>&1
  grep -E "tests passed|\*\*\*Failed|Failure" "$O/t/ctest.log" | head -20
fi
if has d; then
  OUT=$O/d CSATTN_BENCH_DET_TOKENS=16384,131072 CSATTN_BENCH_DET_RATIOS=128 COMPARE_VAR=CSATTN_HCA_DET_GRADS \
    COMPARE_VALUES="default wgmma scratch" CSATTN_BENCH_SECTIONS=deterministic COMPARE_BENCH_TIMEOUT=130 \
    bash scripts/gpu-compare.sh
fi
if has a; then
  echo "== $(left) s left for the dK flush A/B"
  if [ "$(left)" -gt 200 ]; then
    OUT=$O/a COMPARE_FILTER='*CudaAttentionBackward*:Layers/CudaDeterministic*small*:Layers/CudaBackward*-*long4200*' \
      COMPARE_TESTS_PER_VALUE=1 COMPARE_TEST_TIMEOUT=110 COMPARE_VAR=CSATTN_DK_FLUSH \
      COMPARE_VALUES="lines" COMPARE_BENCH=0 bash scripts/gpu-compare.sh > /dev/null
    t=$(( ($(left) - 10) / 2 )); [ "$t" -gt 100 ] && t=100
    OUT=$O/a COMPARE_VAR=CSATTN_DK_FLUSH COMPARE_VALUES="default lines" \
      CSATTN_BENCH_SECTIONS=attention_backward COMPARE_BENCH_TIMEOUT=$t bash scripts/gpu-compare.sh
  fi
  if [ "$(left)" -gt 70 ]; then  # what each flush layout can reach (the 8 rows x 64 B path too)
    echo "== bench: reductions" | tee -a "$O/a/summary.txt"
    timeout -s KILL $(( $(left) - 10 )) build-gpu/csattn bench --device cuda --sections reductions \
      --out /tmp/reductions.json 2>> "$O/a/bench.err" | tee -a "$O/a/summary.txt"
  fi
fi
if has b; then
  echo "== $(left) s left for the indexer select A/B"
  if [ "$(left)" -gt 150 ]; then
    t=$(( ($(left) - 10) / 2 )); [ "$t" -gt 200 ] && t=200
    OUT=$O/b COMPARE_VAR=CSATTN_INDEXER_SELECT COMPARE_VALUES="default shared" \
      CSATTN_BENCH_SECTIONS=indexer COMPARE_BENCH_TIMEOUT=$t bash scripts/gpu-compare.sh
  fi
fi
rm -f "$O"/*/build.log "$O"/*/bench_*.json
[ -f "$O/a/tests.log" ] && grep -E "^== tests|^\[  (FAILED|PASSED|SKIPPED) |Failure" "$O/a/tests.log" | head -30
echo "gpu-ab-thirteenth: $SECONDS s"
