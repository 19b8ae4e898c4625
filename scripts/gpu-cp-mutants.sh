#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root of the copy the tool
# made: checks that the GPU context-parallel parity tests can fail. Builds, runs the CudaCp
# tests once as they are (all must pass), then per mutant - a small deliberate bug of the
# kind context parallelism invites, applied with sed - rebuilds and runs them again: each
# mutant must make at least one test fail ("detected"). Restores every file with git after.
# Never run this in a working tree with edits you want to keep.
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
source scripts/device-build.sh
filter='*CudaCp*:-*Nccl*'
run_tests() {  # $1: log name; prints the failed count (gtest's summary line)
  build-gpu/tests/csattn_tests --gtest_filter="$filter" > "$OUT/$1.log" 2>&1
  local n
  n=$(grep -oE '^\[  FAILED  \] [0-9]+ tests?, listed below' "$OUT/$1.log" | grep -oE '[0-9]+' | head -1)
  echo "${n:-0}"
}
# name | file | sed expression
mutants=(
  "ape gradient summed per block, not per entry|src/cuda/compressor_backward.cu|s/const long row = prev_half ? ent.row0 - m + slot : ent.row0 + slot;/const long row = ent.row0 + slot;/"
  "compressed rows gathered without the map|src/cuda/cp_layer.cpp|s/h.dup_src.push_back(src);/h.dup_src.push_back(base + j);/"
  "a run's copies one row short|src/cuda/cp_layer.cpp|s|copies = std::min((h.seg_pos0\[ur\] + len) / m, entries);|copies = std::min((h.seg_pos0[ur] + len - 1) / m, entries);|"
  "only a row's first copy gets its gradient|src/cuda/cp_rows.cu|s/for (int k = offsets\[q\]; k < offsets\[q + 1\]; ++k)/for (int k = offsets[q]; k < min(offsets[q] + 1, offsets[q + 1]); ++k)/"
  "owned entries at the wrong RoPE position|src/cuda/cp_layer.cpp|s/h.entry_pos\[slot\] = e.position;/h.entry_pos[slot] = e.position + m;/"
)
# A kept build-gpu may hold a mutant's objects (the copy's sources can be older than them):
# touch every file a mutant edits so the baseline is rebuilt from the real sources.
for m in "${mutants[@]}"; do IFS='|' read -r _ file _ <<< "$m"; touch "$file"; done
cmake --build build-gpu -j "$(nproc)" --target csattn_tests >> "$OUT/build.log" 2>&1 || { echo "rebuild failed"; exit 1; }
base=$(run_tests baseline)
echo "== as is: $base failed"
[ "$base" = 0 ] || { echo "gpu-cp-mutants: the tests fail without a mutant"; exit 1; }
grep "cp parity" "$OUT/baseline.log" | sort -k8 -g | tail -3

survived=0
k=0
for m in "${mutants[@]}"; do
  IFS='|' read -r name file expr <<< "$m"
  cp "$file" "$OUT/orig.tmp"
  sed -i "$expr" "$file"
  if cmp -s "$file" "$OUT/orig.tmp"; then
    echo "mutant '$name': the sed matched nothing (update this script)"; survived=1; continue
  fi
  if ! cmake --build build-gpu -j "$(nproc)" --target csattn_tests >> "$OUT/build.log" 2>&1; then
    echo "mutant '$name': build failed"; survived=1
  else
    k=$((k + 1))
    n=$(run_tests "mutant$k")
    if [ "$n" -gt 0 ]; then echo "mutant '$name': detected ($n failed)"; else echo "mutant '$name': SURVIVED"; survived=1; fi
  fi
  git checkout -- "$file" 2>/dev/null || cp "$OUT/orig.tmp" "$file"
  touch "$file"  # newer than the mutant's objects
done
cmake --build build-gpu -j "$(nproc)" --target csattn_tests >> "$OUT/build.log" 2>&1  # back to the real sources
echo "gpu-cp-mutants: $([ $survived = 0 ] && echo 'every mutant detected' || echo 'some mutant survived')"
exit $survived
