#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root:
#   1. compute-sanitizer memcheck over the kernel-level GPU tests (bad addresses, misaligned
#      vector accesses, uninitialised reads show up here, not as wrong numbers);
#   2. Nsight Compute hardware counters (speed of light, occupancy, warp stalls, memory and
#      compute workload) of the four heaviest kernels at the benchmark shapes.
# Here, first: scripts/prepare-device-deps.sh, then call the device tool with
#   carry: [".device"], command: "bash scripts/gpu-profile.sh"
# Options: PROFILE_SANITIZE=0 / PROFILE_NCU=0 skip a part; PROFILE_FILTER=<gtest filter>
# overrides the sanitised tests; PROFILE_KERNELS=<space list of bench section:kernel> the
# profiled kernels. ncu runs with --clock-control none (the device notes: leave clocks alone).
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
start=$(date +%s)
source scripts/device-build.sh

if [ "${PROFILE_SANITIZE:-1}" != 0 ]; then
  filter=${PROFILE_FILTER:-'*CudaCompressorPool*:*CudaNormRope*:*OrderedScatter*:*CudaDeterministic*small*:Layers/CudaForward.*small*'}
  echo "== compute-sanitizer memcheck: $filter"
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 \
    build-gpu/tests/csattn_tests --gtest_filter="$filter" > "$OUT/sanitizer.log" 2>&1
  echo "memcheck rc $? ($(grep -c "^\[       OK \]" "$OUT/sanitizer.log") tests ok)"
  grep -E "ERROR SUMMARY|Invalid|misaligned|FAILED" "$OUT/sanitizer.log" | sort | uniq -c | head -20
fi

if [ "${PROFILE_NCU:-1}" != 0 ]; then
  kernels=${PROFILE_KERNELS:-"attention:sparse_attention_wgmma_kernel attention_backward:attention_backward_wgmma_kernel indexer_loss:indexer_loss_mma_kernel indexer:indexer_topk_wgmma_kernel"}
  for pair in $kernels; do
    section=${pair%%:*}
    kernel=${pair#*:}
    echo "== ncu $kernel (bench section $section, first launch)"
    CSATTN_BENCH_SECTIONS=$section timeout 240 ncu --clock-control none -k "regex:$kernel" \
      --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      build-gpu/csattn_cuda_bench "/tmp/ncu_bench_$section.json" > "/tmp/ncu_$kernel.txt" 2>&1
    echo "ncu rc $?"
    cat "/tmp/ncu_$kernel.txt" >> "$OUT/ncu.txt"  # few files come back: one report
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Theoretical Occupancy|Executed Ipc A|L1/TEX Hit|L2 Hit|DRAM Throughput|Warp Cycles Per Issued|Issue Slots Busy" \
      "/tmp/ncu_$kernel.txt" | sed 's/^ */  /' | head -16
    grep -E "^    (OPT|WRN)" -A2 "/tmp/ncu_$kernel.txt" | head -12
  done
fi
echo "gpu-profile: $(( $(date +%s) - start )) s"
