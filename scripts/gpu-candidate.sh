#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root: one or more candidate
# kernel changes in one call - each one's tests, then the timing of those that passed against
# this tree on the same card.
#   1. builds each candidate tree (CANDIDATE: one tree from scripts/prepare-bench-tree.sh, or
#      several separated by spaces) and runs its ctest entries matching CANDIDATE_REGEX
#      (default: the attention kernels', the layers' and the deterministic cases) eight at a
#      time, logs under $OUT/candidate/<tree>/;
#   2. times the benchmark sections CSATTN_BENCH_SECTIONS (default
#      attention,attention_backward) on this tree and on every candidate whose tests all
#      passed, alternately, for BENCH_ROUNDS rounds (scripts/gpu-bench-trees.sh; tables in
#      $OUT/summary.txt). No timing when none passed.
# Device calls are scarce (a call that finds no machine costs minutes of the session's
# budget): two variants of one idea in one call answer more than one each in two.
# Environment variables reach every tree; a tree ignores a kernel switch it does not know.
# Prefer a candidate tree with only the new path over a run-time switch between paths: a
# second path in the same kernel can change ptxas's schedule for both (the twenty-fifth
# session's shuffled gather ran 10-15% slower beside the owned one). Here, first:
#   bash scripts/prepare-device-deps.sh && bash scripts/prepare-bench-tree.sh <commit> ...
# then call the device tool with carry: [".device"], command:
#   "CANDIDATE='.device/trees/<commit> .device/trees/<commit2>' bash scripts/gpu-candidate.sh"
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT/candidate"
trees=${CANDIDATE:?CANDIDATE: the candidate source trees, e.g. .device/trees/<commit> (several: space-separated)}
regex=${CANDIDATE_REGEX:-'CudaAttentionForward|CudaAttentionBackward|CudaBackward|CudaForward|CudaDeterministic|CudaIndexerLoss'}
start=$(date +%s)
root=$PWD
passed=
for tree in $trees; do
  name=$(basename "$tree")
  log="$OUT/candidate/$name"
  mkdir -p "$log"
  echo "== candidate $tree: tests matching $regex"
  (cd "$tree" && OUT="$log" CSATTN_THIRD_PARTY_DIR="$root/.device/third_party" \
     GPU_CHECK_REGEX="$regex" GPU_CHECK_BENCH=0 GPU_CHECK_RUN=0 GPU_CHECK_TORCH=0 \
     bash scripts/gpu-check.sh) 2>&1 | grep -v "ptxas\|stack frame" | tail -25
  if grep -q "100% tests passed" "$log/ctest.log" 2>/dev/null; then
    passed="$passed $tree"
  else
    echo "gpu-candidate: $name: its tests did not all pass (candidate/$name/ctest.log); not timed"
  fi
done
if [ -z "$passed" ]; then
  echo "gpu-candidate: no candidate passed its tests; no timing"
  exit 1
fi
echo "== timing: this tree against$passed"
BENCH_TREES="$passed" BENCH_ROUNDS="${BENCH_ROUNDS:-2}" \
  CSATTN_BENCH_SECTIONS="${CSATTN_BENCH_SECTIONS:-attention,attention_backward}" \
  bash scripts/gpu-bench-trees.sh 2>&1 | grep -vE "^ +(producer|consumer|item)" | grep -v "ptxas\|stack frame"
echo "gpu-candidate: $(( $(date +%s) - start )) s"
