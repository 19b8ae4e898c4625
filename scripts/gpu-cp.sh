#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root: GPU context
# parallelism in one call. Builds csattn (scripts/device-build.sh), runs the gtest cases of
# CP_FILTER (default: every CUDA and GPU-communicator test), `csattn run` context-parallel on
# the GPU (ranks as threads, then under mpirun), and with CP_BENCH=1 the `cp` benchmark
# section (CSATTN_BENCH_CP_TOKENS picks the lengths; CP_BENCH_SECTIONS runs other sections
# with it, e.g. "cp,layer"). Logs and the benchmark JSON in $OUT.
# Here, first: scripts/prepare-device-deps.sh; call the device tool with carry: [".device"]
# and kind nvidia-h200-x2 (or more GPUs) for the NCCL cases.
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on these machines (KINDS.md)
start=$(date +%s)
nvidia-smi -L
source scripts/device-build.sh

rc=0
filter=${CP_FILTER:-'*Cuda*:*GpuComm*'}
if [ "$filter" != none ]; then
  echo "== tests: $filter"
  # Killed after CP_TEST_TIMEOUT s (a hung kernel or collective; status 137).
  timeout -s KILL "${CP_TEST_TIMEOUT:-400}" build-gpu/tests/csattn_tests --gtest_filter="$filter" \
    > "$OUT/tests.log" 2>&1 || rc=1
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|error:|Expected|Which is|actual" "$OUT/tests.log" | head -60
fi
if [ "${CP_CLI:-1}" = 1 ]; then
  echo "== csattn run, 2 ranks as threads, two_chunk"
  build-gpu/csattn run --cp-mode two_chunk --cp-ranks 2 --device cuda > "$OUT/cli_threads.log" 2>&1 || rc=1
  tail -25 "$OUT/cli_threads.log"
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then  # NCCL: one GPU per MPI rank
    echo "== mpirun -np 2 csattn run, contiguous"
    mpirun --allow-run-as-root -np 2 -x NCCL_NVLS_ENABLE build-gpu/csattn run --cp-mode contiguous \
      --device cuda > "$OUT/cli_mpi.log" 2>&1 || rc=1
    tail -25 "$OUT/cli_mpi.log"
    echo "== mpirun -np 2 python3 tests/python/cp_mpi_check.py --device cuda"
    PYTHONPATH="$PWD/build-gpu/python${PYTHONPATH:+:$PYTHONPATH}" mpirun --allow-run-as-root -np 2 \
      -x NCCL_NVLS_ENABLE -x PYTHONPATH python3 tests/python/cp_mpi_check.py --device cuda \
      > "$OUT/python_cp.log" 2>&1 || rc=1
    tail -5 "$OUT/python_cp.log"
  fi
fi
if [ "${CP_BENCH:-0}" = 1 ]; then
  echo "== bench: cp"
  CSATTN_BENCH_SECTIONS=${CP_BENCH_SECTIONS:-cp} build-gpu/csattn bench --device cuda --out "$OUT/bench_cp.json" \
    2> "$OUT/bench.err" | tee "$OUT/bench_cp.txt" || { rc=1; tail -5 "$OUT/bench.err"; }
fi
echo "gpu-cp: rc $rc, $(( $(date +%s) - start )) s"
exit $rc
