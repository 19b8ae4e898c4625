#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root: a candidate kernel
# change in one call - its tests, then its timing against this tree on the same card.
#   1. builds the candidate tree (CANDIDATE, a tree from scripts/prepare-bench-tree.sh) and
#      runs its ctest entries matching CANDIDATE_REGEX (default: the attention kernels', the
#      layers' and the deterministic cases) eight at a time, logs under $OUT/candidate/;
#   2. if they passed, times the benchmark sections CSATTN_BENCH_SECTIONS (default
#      attention,attention_backward) on this tree and on the candidate, alternately, for
#      BENCH_ROUNDS rounds (scripts/gpu-bench-trees.sh; tables in $OUT/summary.txt).
# Environment variables reach both trees; a tree ignores a kernel switch it does not know.
# Prefer a candidate tree with only the new path over a run-time switch between paths: a
# second path in the same kernel can change ptxas's schedule for both (the twenty-fifth
# session's shuffled gather ran 10-15% slower beside the owned one). Here, first:
#   bash scripts/prepare-device-deps.sh && bash scripts/prepare-bench-tree.sh <commit>
# then call the device tool with carry: [".device"], command:
#   "CANDIDATE=.device/trees/<commit> bash scripts/gpu-candidate.sh"
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT/candidate"
tree=${CANDIDATE:?CANDIDATE: the candidate source tree, e.g. .device/trees/<commit>}
regex=${CANDIDATE_REGEX:-'CudaAttentionForward|CudaAttentionBackward|CudaBackward|CudaForward|CudaDeterministic|CudaIndexerLoss'}
start=$(date +%s)
root=$PWD
echo "== candidate $tree: tests matching $regex"
(cd "$tree" && OUT="$OUT/candidate" CSATTN_THIRD_PARTY_DIR="$root/.device/third_party" \
   GPU_CHECK_REGEX="$regex" GPU_CHECK_BENCH=0 GPU_CHECK_RUN=0 GPU_CHECK_TORCH=0 \
   bash scripts/gpu-check.sh) 2>&1 | grep -v "ptxas\|stack frame" | tail -25
if ! grep -q "100% tests passed" "$OUT/candidate/ctest.log" 2>/dev/null; then
  echo "gpu-candidate: the candidate's tests did not all pass (candidate/ctest.log); no timing"
  exit 1
fi
echo "== timing: this tree against $tree"
BENCH_TREES="$tree" BENCH_ROUNDS="${BENCH_ROUNDS:-2}" \
  CSATTN_BENCH_SECTIONS="${CSATTN_BENCH_SECTIONS:-attention,attention_backward}" \
  bash scripts/gpu-bench-trees.sh 2>&1 | grep -vE "^ +(producer|consumer|item)" | grep -v "ptxas\|stack frame"
echo "gpu-candidate: $(( $(date +%s) - start )) s"
