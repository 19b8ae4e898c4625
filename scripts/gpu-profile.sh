#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root:
#   1. compute-sanitizer memcheck over the kernel-level GPU tests (bad addresses, misaligned
#      vector accesses, uninitialised reads show up here, not as wrong numbers);
#   2. Nsight Compute hardware counters (speed of light, occupancy, warp stalls, memory and
#      compute workload) of the four heaviest kernels at the benchmark shapes.
# Here, first: scripts/prepare-device-deps.sh, then call the device tool with
#   carry: [".device"], command: "bash scripts/gpu-profile.sh"
# Options: PROFILE_SANITIZE=0 / PROFILE_NCU=0 skip a part; PROFILE_FILTER=<gtest filter>
# overrides the sanitised tests; PROFILE_KERNELS=<space list of bench section:kernel[:skip]>
# the profiled kernels, each its first launch in that bench section or the one after `skip`
# matching launches (the `attention` section launches each case 7 times - 2 warm-ups, 5 timed
# - in the order Flash 8K / 32K / 64K keys, Pro 8K / 32K / 64K: skip 28 is Pro at 32K keys);
# PROFILE_SET=full collects ncu's full set instead of the sections below, with PC sampling:
# then each kernel's per-SASS-instruction counters (stall samples by reason) go to
# ncu_source_<kernel>_<skip>.csv.gz (for scripts/ncu_source_summary.py) and every metric to
# ncu_raw_<kernel>_<skip>.csv.gz, both in $OUT/ncu_data.tar. ncu runs with
# --clock-control none (the device notes: leave clocks alone), each killed after
# PROFILE_NCU_TIMEOUT s (240).
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
  rm -rf /tmp/ncu_data  # a warm machine keeps /tmp: no earlier call's data in this tar
  kernels=${PROFILE_KERNELS:-"attention:sparse_attention_wgmma_kernel attention_backward:attention_backward_wgmma_kernel indexer_loss:indexer_loss_mma_kernel indexer:indexer_topk_wgmma_kernel"}
  for spec in $kernels; do
    IFS=: read -r section kernel skip <<< "$spec"
    skip=${skip:-0}
    name="${kernel}_$skip"
    echo "== ncu $kernel (bench section $section, launch $((skip + 1)))"
    if [ "${PROFILE_SET:-}" = full ]; then
      what=(--set full --import-source no)
    else
      what=(--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats
            --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis)
    fi
    CSATTN_BENCH_SECTIONS=$section timeout "${PROFILE_NCU_TIMEOUT:-240}" ncu --clock-control none -k "regex:$kernel" \
      --launch-skip "$skip" --launch-count 1 "${what[@]}" --export "/tmp/ncu_$name" --force-overwrite \
      build-gpu/csattn_cuda_bench "/tmp/ncu_bench_$section.json" > "/tmp/ncu_$name.txt" 2>&1
    echo "ncu rc $?"
    # With --export, ncu prints no sections to stdout: the details page comes from the report.
    [ -f "/tmp/ncu_$name.ncu-rep" ] &&
      ncu --import "/tmp/ncu_$name.ncu-rep" --page details >> "/tmp/ncu_$name.txt" 2>&1
    cat "/tmp/ncu_$name.txt" >> "$OUT/ncu.txt"  # few files come back: one report
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Theoretical Occupancy|Executed Ipc A|L1/TEX Hit|L2 Hit|DRAM Throughput|Warp Cycles Per Issued|Issue Slots Busy" \
      "/tmp/ncu_$name.txt" | sed 's/^ */  /' | head -16
    grep -E "^    (OPT|WRN)" -A2 "/tmp/ncu_$name.txt" | head -12
    if [ "${PROFILE_SET:-}" = full ] && [ -f "/tmp/ncu_$name.ncu-rep" ]; then
      # Every SASS instruction with its warp-state samples (all and not issued, by reason).
      ncu --import "/tmp/ncu_$name.ncu-rep" --page source --csv --print-source sass \
        > "/tmp/ncu_source_$name.csv" 2> "/tmp/ncu_source_$name.err"
      echo "source page rc $?: $(wc -l < "/tmp/ncu_source_$name.csv") lines"
      head -3 "/tmp/ncu_source_$name.err"
      mkdir -p /tmp/ncu_data
      gzip -c "/tmp/ncu_source_$name.csv" > "/tmp/ncu_data/ncu_source_$name.csv.gz"
      # Every collected metric by name (tensor pipe, shared-memory wavefronts, L2 and DRAM bytes).
      ncu --import "/tmp/ncu_$name.ncu-rep" --page raw --csv | gzip -c > "/tmp/ncu_data/ncu_raw_$name.csv.gz"
      python3 scripts/ncu_source_summary.py "/tmp/ncu_source_$name.csv" 2>&1 | head -60
    fi
  done
  # One file back for all kernels (the device returns at most 8 files a call).
  [ -d /tmp/ncu_data ] && tar -cf "$OUT/ncu_data.tar" -C /tmp ncu_data
fi
echo "gpu-profile: $(( $(date +%s) - start )) s"
