#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root: an A/B measurement of
# kernel variants picked by an environment variable, in one build and one call.
#   COMPARE_VAR=CSATTN_ATTENTION COMPARE_VALUES="wgmma split" CSATTN_BENCH_SECTIONS=attention \
#     bash scripts/gpu-compare.sh
# builds csattn (scripts/device-build.sh), runs the gtest cases of COMPARE_FILTER (if set; mind
# the prefixes of parameterised suites: '*CudaBackward*', not 'CudaBackward.*') and
# the ctest entries matching COMPARE_CTEST (if set; with COMPARE_TESTS_PER_VALUE=1 the gtest
# cases once per value of the variable), then `csattn bench --device cuda` once per
# value with COMPARE_VAR set to it (the sections of CSATTN_BENCH_SECTIONS), each run's table in
# $OUT/summary.txt and its JSON in $OUT/bench_<value>.json.
# COMPARE_BENCH=0 skips the benchmark runs. The test run and each benchmark run are killed after COMPARE_TEST_TIMEOUT /
# COMPARE_BENCH_TIMEOUT seconds (default 240 / 300; status 137 in the log), so a kernel that
# hangs costs one step, not the whole device call.
# Here, first: scripts/prepare-device-deps.sh; call the device tool with carry: [".device"].
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
start=$(date +%s)
SUMMARY="$OUT/summary.txt"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > "$SUMMARY" 2>&1

source scripts/device-build.sh

rc=0
var=${COMPARE_VAR:-}
if [ -n "${COMPARE_FILTER:-}" ]; then
  # COMPARE_TESTS_PER_VALUE=1: the tests once per value of COMPARE_VAR (candidates that only
  # the variable reaches), all in tests.log; else once, without the variable.
  values=default
  [ "${COMPARE_TESTS_PER_VALUE:-0}" = 1 ] && [ -n "$var" ] && values=${COMPARE_VALUES:-default}
  : > "$OUT/tests.log"
  for value in $values; do
    if [ "$value" != default ]; then set_var=("$var=$value"); else set_var=(); fi
    echo "== tests: $COMPARE_FILTER${set_var[0]+ (${set_var[0]})}" | tee -a "$OUT/tests.log"
    env ${set_var[@]+"${set_var[@]}"} timeout -s KILL "${COMPARE_TEST_TIMEOUT:-240}" build-gpu/tests/csattn_tests \
      --gtest_filter="$COMPARE_FILTER" >> "$OUT/tests.log" 2>&1 ||
      { st=$?; rc=1; echo "tests${set_var[0]+ (${set_var[0]})}: status $st (137: killed by the timeout)"; }
  done
  grep -E "^== tests|^\[  (FAILED|PASSED|SKIPPED) |Failure|error:" "$OUT/tests.log" | head -60
fi
if [ -n "${COMPARE_CTEST:-}" ]; then
  echo "== ctest -R $COMPARE_CTEST"
  ctest --test-dir build-gpu -R "$COMPARE_CTEST" --output-on-failure --timeout 300 > "$OUT/ctest.log" 2>&1 || rc=1
  grep -E "tests passed|Failed|\*\*\*|Error|error" "$OUT/ctest.log" | head -40
fi

if [ "${COMPARE_BENCH:-1}" != 0 ]; then  # COMPARE_BENCH=0: the tests only
  for value in ${COMPARE_VALUES:-default}; do
    echo "== bench: ${var:-(no variable)}=$value" | tee -a "$SUMMARY"
    if [ -n "$var" ] && [ "$value" != default ]; then
      env "$var=$value" timeout -s KILL "${COMPARE_BENCH_TIMEOUT:-300}" build-gpu/csattn bench --device cuda \
        --out "$OUT/bench_$value.json" 2>> "$OUT/bench.err" | tee -a "$SUMMARY"
    else
      timeout -s KILL "${COMPARE_BENCH_TIMEOUT:-300}" build-gpu/csattn bench --device cuda \
        --out "$OUT/bench_$value.json" 2>> "$OUT/bench.err" | tee -a "$SUMMARY"
    fi
    [ "${PIPESTATUS[0]}" = 0 ] || { rc=1; tail -5 "$OUT/bench.err"; }
  done
fi
echo "gpu-compare: rc $rc, $(( $(date +%s) - start )) s"
exit $rc
