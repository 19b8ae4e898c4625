#!/usr/bin/env bash
# Runs on the lent GPU machine (device tool), from the repository root: the check of the
# eighteenth session's first call. The attention backward kernels' row terms (D_row = dO . O,
# the sink term; attention_row_terms.cuh) now issue every load of a warp's rows before the
# first is used, and the wgmma backward issues its Q / dO copies before building the key list -
# both written in the seventeenth session without a device, bitwise the same results.
# Under $OUT:
#   t/: the whole suite (ctest -j 8);
#   b/: the `attention_backward` and `layer` (64K tokens) sections on this tree and on the tree
#       before the change (.device/trees/$AB_BASE, default e55d299), built apart, run one after
#       the other on the same card.
# AB_PARTS picks the parts (default "t b", ~8-9 minutes with the machine's start: close to
# the 10-minute call limit; "t" or "b" alone in separate calls if a run is cut short).
# Here, first: scripts/prepare-device-deps.sh and scripts/prepare-bench-tree.sh e55d299; call
# the device tool with carry: [".device"]. Goes once the change is decided.
set -uo pipefail
O=${OUT:-$PWD/out}
mkdir -p "$O/t" "$O/b"
rc=0
parts=${AB_PARTS:-t b}
if [[ " $parts " == *" t "* ]]; then
  OUT=$O/t
  source scripts/device-build.sh
  echo "== tests"
  ctest --test-dir build-gpu -j 8 --timeout 300 --output-on-failure > "$O/t/ctest.log" 2>&1 || rc=1
  grep -E "tests passed|Failed|\*\*\*" "$O/t/ctest.log" | grep -v "Passed" | tail -30
  rm -f "$O/t/build.log"
fi
[[ " $parts " == *" b "* ]] && { OUT=$O/b BENCH_TREES=.device/trees/${AB_BASE:-e55d299} BENCH_ROUNDS=1 BENCH_TREES_TIMEOUT=200 \
  CSATTN_BENCH_SECTIONS=${AB_SECTIONS:-attention_backward,layer} CSATTN_BENCH_LAYER_TOKENS=${AB_LAYER_TOKENS:-65536} \
  bash scripts/gpu-bench-trees.sh || rc=1; }
echo "gpu-ab-row-terms: rc $rc, $SECONDS s"
exit $rc
