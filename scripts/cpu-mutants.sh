#!/usr/bin/env bash
# Checks that the CPU test suite can fail: per mutant - one small deliberate bug of the kind
# each equation invites (a term dropped, an off-by-one in causality, a sign, a tie order),
# applied with sed to the CPU backend, the shared index code or CPU context parallelism - rebuilds, runs the GPU-free
# ctest entries and expects at least one to fail ("detected"). A mutant that survives names a
# property no test checks.
#   make mutants                                          # every mutant (~10 s each)
#   MUTANTS='sink|window' bash scripts/cpu-mutants.sh     # those whose name matches
# It builds in its own CPU-only tree (BUILD_DIR, default build-mutants: CUDA and Python off,
# configured on first use), so a mutant costs one object and one link, and the suite runs
# without the CUDA runtime's start-up per test process. Every edited file is restored from a
# copy (also on Ctrl-C) and touched, so both trees return to the real sources; uncommitted
# edits elsewhere are left alone, but do not edit the mutated files while it runs. CI runs it
# after `make test`. Logs: $OUT (default out/cpu-mutants).
set -uo pipefail
BUILD_DIR=${BUILD_DIR:-build-mutants}
OUT=${OUT:-$PWD/out/cpu-mutants}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  echo "== configuring $BUILD_DIR (CPU only)"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCSATTN_CUDA=OFF \
    -DCSATTN_PYTHON=OFF > "$OUT/configure.log" 2>&1 ||
    { echo "cpu-mutants: configuring $BUILD_DIR failed (see $OUT/configure.log)"; exit 2; }
fi

# name | file | sed script (may hold '|': everything after the second '|' is the script)
mutants=(
  "attention: the sink left out of the softmax denominator|src/cpu/attention.cpp|s/float z = std::exp(a.sink\[h\] - mx);/float z = 0.0f;/"
  "attention backward: the value term P^T dO of dKV dropped|src/cpu/attention.cpp|s/gemm(true, false, n, D, H, 1.0f, p.data(), n, g, D, 0.0f, dk.data(), D);/std::fill(dk.begin(), dk.end(), 0.0f);/"
  "attention backward: d_sink with the wrong sign|src/cpu/attention.cpp|s/ds\[h\] -= /ds[h] += /"
  "index: the sliding window one row short|src/core/attention_index.cpp|s/std::max(pos - window + 1, 0)/std::max(pos - window + 2, 0)/"
  "index: an HCA query sees the entry it is still inside|src/core/attention_index.cpp|s|(pos + 1) / R|(pos + 2) / R|"
  "compact indexer: a row sees one compressed key too many|src/core/compact_layout.cpp|s|return std::clamp<std::int64_t>((offset + t + 1) / ratio|return std::clamp<std::int64_t>((offset + t + 2) / ratio|"
  "top-k: ties go to the larger index|src/cpu/topk_select.cpp|s/(0xFFFFFFFFu - static_cast<std::uint32_t>(j))/static_cast<std::uint32_t>(j)/;s/static_cast<std::int32_t>(0xFFFFFFFFu - static_cast<std::uint32_t>(scratch\[j\]))/static_cast<std::int32_t>(static_cast<std::uint32_t>(scratch[j]))/"
  "RMSNorm backward: rstd^2 where rstd^3 belongs|src/cpu/elementwise.cpp|s|const double c = s \* s \* s \* dot / n;|const double c = s * s * dot / n;|"
  "RoPE: the inverse rotation turns forwards|src/cpu/elementwise.cpp|s/std::sin(angle) \* static_cast<float>(sign)/std::sin(angle)/"
  "Hadamard: the 1/sqrt(n) scale left out|src/cpu/elementwise.cpp|s/for (int i = 0; i < n; ++i) v\[i\] \*= scale;/(void)scale;/"
  "YaRN: the ramp reversed|src/core/rope_table.cpp|s|extra / cfg.yarn_factor \* ramp + extra \* (1.0 - ramp)|extra / cfg.yarn_factor * (1.0 - ramp) + extra * ramp|"
  "compressor: the previous block's A half left out (ratio 4)|src/cpu/compressor.cpp|s/if (e.prev_row >= 0)/if (false)/"
  "compressor backward: ape gets no gradient|src/cpu/compressor.cpp|s/dape\[cand\[k\].slot \* width + cand\[k\].col\] += dscore;/(void)dape;/"
  "indexer loss: the window left out of the teacher's denominator|src/cpu/indexer_loss.cpp|s/for (int k = 0; k < nw; ++k) zsum += std::exp(s.zw\[h \* nw + k\] - mx);/(void)nw;/"
  "indexer loss: padding rows scored|src/cpu/indexer_loss.cpp|s/return geo.row_is_padding\[row\] ? 0 : geo.visible_compressed(row);/return geo.visible_compressed(row);/"
  "indexer loss: the mean over every row, padding included|src/cpu/indexer_loss.cpp|s|a.coeff / static_cast<double>(geo.real_rows)|a.coeff / static_cast<double>(geo.rows)|"
  "indexer loss backward: the ReLU mask dropped|src/cpu/indexer_loss.cpp|s/dot > 0.0f ? s.g\[k\] \* wi\[h\] : 0.0f/s.g[k] * wi[h]/"
  "MXFP8: the E8M0 scale rounds down|src/cpu/mxfp8.cpp|s/) ++exponent;/) exponent += 0;/"
  "MXFP8 scale layout: row and row-block strides swapped inside the 128x4 atom|src/core/mxfp8_layout.hpp|s|16 \* (m % 32) + 4 \* ((m % kAtomRows) / 32)|4 * (m % 32) + 16 * ((m % kAtomRows) / 32)|"
  "MXFP8 THD scales: a sequence's span not rounded to whole atoms|src/core/mxfp8_layout.cpp|s/out\[b\] + round_up(len, a)/out[b] + len/"
  "padded THD: the first padding row counted as real|src/core/geometry.cpp|s/p >= real ? 1 : 0/p > real ? 1 : 0/"
  "grouped O projection: every group reads group 0's weights|src/cpu/layer_ops.cpp|s/woa + static_cast<long>(g) \* ro \* gd, gd, 0.0f, u/woa, gd, 0.0f, u/"
  "attention scale: 1/sqrt(rope_dim) for 1/sqrt(head_dim)|src/cpu/layer_ops.cpp|s|1.0 / std::sqrt(static_cast<double>(c.head_dim))|1.0 / std::sqrt(static_cast<double>(c.rope_dim))|"
  "indexer weights: the 1/sqrt(heads) scale left out|src/cpu/layer_ops.cpp|s/v = bf16 ? round_bf16(v \* head_scale) : v \* head_scale;/(void)head_scale;/"
  "release FP8 weights: the block scale ignored|src/core/block_fp8.cpp|s/round_bf16(v \* srow\[j \/ kFp8WeightBlock\])/round_bf16(v)/"
  "release FP8 weights: every row block reads the first row of scales|src/core/block_fp8.cpp|s/s.data() + (i \/ kFp8WeightBlock) \* want\[1\]/s.data()/"
  "checkpoint: the MTP module's compress_ratios entry read as a main layer|src/io/checkpoint.cpp|s/return m > 0 \&\& index >= m ? CheckpointLayer::mtp_module(index - m) : CheckpointLayer(index);/return CheckpointLayer(index);/"
  "config.json: num_hidden_layers kept from the defaults beside the file's compress_ratios|src/core/config_json.cpp|s/    m.num_hidden_layers = 0;/    (void)0;/"
  "CP: a rank's halo two rows short|src/cp/layer_plan.cpp|s/g = std::max(a - d_w, geo.seg_start\[s\])/g = std::max(a - d_w + 2, geo.seg_start[s])/"
  "CP: the halo rows' gradients never reach their owners|src/cp/cp_layer.cpp|/const float\* src = recv\[k\].data() + i \* cols;/{n;s/dst\[j\] += src\[j\];/(void)src;/}"
  "CP: fp32 ranks without batch-invariant GEMMs|src/cp/cp_layer.cpp|s/BatchInvariantScope batch_invariant(options_.precision == Precision::fp32);/BatchInvariantScope batch_invariant(false);/"
)

current_file=
restore() {  # $1: say so (an interrupted run)
  if [ -n "$current_file" ] && [ -f "$OUT/orig.tmp" ]; then
    cp "$OUT/orig.tmp" "$current_file" && touch "$current_file"
    [ -n "${1:-}" ] && echo "cpu-mutants: restored $current_file"
  fi
  current_file=
}
trap 'restore loud; exit 130' INT TERM
trap 'restore loud' EXIT

build() { cmake --build "$BUILD_DIR" -j "$JOBS" >> "$OUT/build.log" 2>&1; }
# Prints the number of failed ctest entries (0 when all passed).
run_suite() {
  # A mutant may make ranks wait on each other: a hang counts as a failure after 120 s.
  ctest --test-dir "$BUILD_DIR" -j "$JOBS" --timeout 120 -E 'Cuda|Gpu|Nccl' > "$OUT/$1.log" 2>&1
  local n
  n=$(grep -oE 'tests passed, [0-9]+ tests failed' "$OUT/$1.log" | grep -oE '[0-9]+ tests failed' | grep -oE '[0-9]+')
  echo "${n:-?}"
}

echo "== building $BUILD_DIR"
build || { echo "cpu-mutants: the build fails as is (see $OUT/build.log)"; exit 2; }
base=$(run_suite baseline)
echo "== as is: $base failed"
[ "$base" = 0 ] || { echo "cpu-mutants: the suite fails without a mutant ($OUT/baseline.log)"; exit 2; }

survived=0 k=0 tried=0
for m in "${mutants[@]}"; do
  IFS='|' read -r name file expr <<< "$m"
  k=$((k + 1))
  if [ -n "${MUTANTS:-}" ] && ! grep -qE "$MUTANTS" <<< "$name"; then continue; fi
  tried=$((tried + 1))
  cp "$file" "$OUT/orig.tmp"
  current_file=$file
  sed -i "$expr" "$file"
  start=$(date +%s)
  if cmp -s "$file" "$OUT/orig.tmp"; then
    echo "mutant $k '$name': the sed matched nothing (update this script)"; survived=1
  elif ! build; then
    echo "mutant $k '$name': build failed (see $OUT/build.log)"; survived=1
  else
    n=$(run_suite "mutant$k")
    if [ "$n" != "?" ] && [ "$n" -gt 0 ]; then
      first=$(grep -E '^\s+[0-9]+ - ' "$OUT/mutant$k.log" | grep -v Skipped | head -1 | sed -E 's/^\s+[0-9]+ - //; s/ \(.*//')
      echo "mutant $k '$name': detected ($n failed, e.g. $first) [$(( $(date +%s) - start )) s]"
    else
      echo "mutant $k '$name': SURVIVED ($OUT/mutant$k.log) [$(( $(date +%s) - start )) s]"; survived=1
    fi
  fi
  restore
done
build || { echo "cpu-mutants: the rebuild from the real sources failed"; exit 2; }
[ "$tried" -gt 0 ] || { echo "cpu-mutants: no mutant matches MUTANTS='${MUTANTS:-}'"; exit 2; }
echo "cpu-mutants: $tried mutants, $([ $survived = 0 ] && echo 'every one detected' || echo 'some survived')"
exit $survived
