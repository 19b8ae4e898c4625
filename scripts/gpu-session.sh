#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root: one call that does
# what the card it lands on is wanted for. On an H200 (where the issues' targets are stated)
# the benchmark sections SESSION_H200_SECTIONS; on any other card the Nsight Compute profile
# SESSION_PROFILE_KERNELS (gpu-profile.sh with PROFILE_SET=full). Both first run the ctest
# entries matching SESSION_TEST_REGEX (if set). A call for the default device kind may come
# as either card, and a start costs minutes of the session's device time: this avoids a
# second start to get the other measurement.
# Here, first: scripts/prepare-device-deps.sh, then call the device tool with
#   carry: [".device"], command: "bash scripts/gpu-session.sh"
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "== card: $card"
tests=(GPU_CHECK_TESTS=0)
[ -n "${SESSION_TEST_REGEX:-}" ] && tests=(GPU_CHECK_REGEX="$SESSION_TEST_REGEX")
if [[ "$card" == *H200* ]]; then
  env "${tests[@]}" GPU_CHECK_RUN=0 GPU_CHECK_TORCH=0 \
    CSATTN_BENCH_SECTIONS="${SESSION_H200_SECTIONS:-attention,attention_backward,indexer,elementwise,layer}" \
    bash scripts/gpu-check.sh
else
  if [ -n "${SESSION_TEST_REGEX:-}" ]; then
    env "${tests[@]}" GPU_CHECK_BENCH=0 GPU_CHECK_RUN=0 bash scripts/gpu-check.sh
  fi
  PROFILE_SANITIZE=0 PROFILE_SET=full \
    PROFILE_KERNELS="${SESSION_PROFILE_KERNELS:-attention:sparse_attention_wgmma_kernel:28}" \
    bash scripts/gpu-profile.sh
fi
