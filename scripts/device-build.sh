#!/usr/bin/env bash
# Sourced by the device scripts (gpu-check.sh, gpu-profile.sh): configures and builds csattn
# with the CUDA backend into build-gpu, the log in $OUT/build.log; exits on failure.
TP=${CSATTN_THIRD_PARTY_DIR:-$PWD/.device/third_party}
export PATH=/usr/local/cuda/bin:$PATH
# The pinned nanobind of prepare-device-deps.sh before the device Python's own (if any).
[ -d "$TP/python/nanobind" ] && export PYTHONPATH="$TP/python${PYTHONPATH:+:$PYTHONPATH}"
build_start=$(date +%s)
echo "== configure + build"
if ! cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCSATTN_THIRD_PARTY_DIR="$TP" > "$OUT/build.log" 2>&1 ||
   ! cmake --build build-gpu -j "$(nproc)" >> "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"
  echo "device build failed (log: build.log)"
  exit 1
fi
grep -E "ptxas warning|bytes stack frame" "$OUT/build.log" | sed 's/^ *//' | sort -u | tail -20
echo "build: $(( $(date +%s) - build_start )) s"
