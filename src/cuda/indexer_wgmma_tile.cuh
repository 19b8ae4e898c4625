// What the two wgmma indexer kernels share (indexer_topk_wgmma.cu: two scoring warpgroups
// that then select; indexer_topk_wgmma_overlap.cu: the same scoring beside a selecting
// warpgroup): the shared-memory layout, the operands' swizzled offsets and the epilogue that
// turns a tile's accumulator into the four rows' scores, bit for bit the tiled kernel's.
#pragma once
#include <cstdint>

#include "cuda/indexer_block.cuh"
#include "cuda/indexer_score.cuh"
#include "cuda/mma_util.cuh"
#include "cuda/tma.hpp"
#include "cuda/wgmma.cuh"
#include "cuda/wgmma_sync.cuh"

namespace csattn::cuda::idxwg {

constexpr int kRows = idxblock::kRows;  // query rows per CTA (the scratch slot's rows)
constexpr int kHeads = 64;            // head columns per row; fewer heads are zero-padded
constexpr int kCols = kRows * kHeads; // the wgmma N
static_assert(kCols == 256, "one m64n256 wgmma covers the CTA's rows");
constexpr int kKeys = 64;             // keys per tile (the wgmma M)
constexpr int kStages = 3;            // per scoring warpgroup
constexpr int kScoreThreads = 256;    // the two scoring warpgroups, threads 0-255 of the CTA

template <int DI>
struct Layout {  // byte offsets from the 1024-aligned base
  static constexpr int kBlocks = DI / 64;                // 64-dim (128-byte) column blocks
  static constexpr int kQBlock = kCols * 128;            // [256 x 64 dims]
  static constexpr int kKBlock = kKeys * 128;            // [64 x 64 dims]
  static constexpr int kTileBytes = kBlocks * kKBlock;
  static constexpr int kQOff = 0;
  static constexpr int kKOff = kQOff + kBlocks * kQBlock;
  static constexpr int kHistOff = kKOff + 2 * kStages * kTileBytes;
  static constexpr int kWOff = kHistOff + kRows * idxsel::kBins * 4;
  static constexpr int kBytes = kWOff + kCols * 4;
};

// The TMA map of the key tiles ([d.comp_capacity, DI] bf16 rows, kKeys x 64-dim boxes), for
// both wgmma kernels' launches. No compressed rows (a CSA batch of fewer than 4 rows, a CP
// rank without entries): an empty map, never read - no row has a visible key, none is loaded.
template <int DI>
inline CUtensorMap key_tile_map(const LayerDims& d, const bf16* keys) {
  CUtensorMap map{};
  if (d.comp_capacity > 0) map = bf16_rows_tensor_map(keys, d.comp_capacity, DI, kKeys, 64);
  return map;
}

// Byte offset of 16-byte chunk `cc` of row `row` in a swizzled [rows x DI] operand made of
// column blocks of `block_bytes` (wgmma's 128-byte swizzle, see wgmma.cuh).
__device__ __forceinline__ std::uint32_t op_off(int row, int cc, int block_bytes) {
  return static_cast<std::uint32_t>((cc >> 3) * block_bytes + row * 128 + (((cc & 7) ^ (row & 7)) << 4));
}

// The scores of a tile from its m64n256 accumulator: ReLU, the head weights (w_s: [kRows,
// kHeads]) and the sum over the heads. acc[4i + 2 half + e] = S[key 16 (warp % 4) + g + 8
// half][column 8i + 2q + e]; row r's head h is column 64 r + h, so its group G holds i = 8r +
// 2G (heads 16G + 2q + e) and i + 1 (heads 16G + 8 + 2q + e). Lane q keeps row q's two
// scores: mine[half] is row qd's score of key 16 (warp % 4) + g + 8 half.
__device__ __forceinline__ void head_sums(const float (&acc)[128], const float* w_s, int qd, float (&mine)[2]) {
  // Per head group, the four rows' partial sums reduce-scattered over the quad: lane q
  // keeps row q, adding in the butterfly's order (own + lane ^ 1, then + lane ^ 2's
  // pair), so the scores keep their bits.
  const bool odd = (qd & 1) != 0, upper = (qd & 2) != 0;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float s = 0.0f;
#pragma unroll
    for (int G = 0; G < 4; ++G) {
      float a[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int lo = 4 * (8 * r + 2 * G) + 2 * half, hi = lo + 4;
        const float2 w0 = *reinterpret_cast<const float2*>(w_s + r * kHeads + 16 * G + 2 * qd);
        const float2 w8 = *reinterpret_cast<const float2*>(w_s + r * kHeads + 16 * G + 8 + 2 * qd);
        a[r] = head_pair_term(w0.x, acc[lo], w8.x, acc[hi]) + head_pair_term(w0.y, acc[lo + 1], w8.y, acc[hi + 1]);
      }
      // Step 1 (lane ^ 1): rows odd and 2 + odd stay, the other two go to the partner.
      const float t0 = (odd ? a[1] : a[0]) + __shfl_xor_sync(0xffffffffu, odd ? a[0] : a[1], 1);
      const float t1 = (odd ? a[3] : a[2]) + __shfl_xor_sync(0xffffffffu, odd ? a[2] : a[3], 1);
      // Step 2 (lane ^ 2): row qd stays, row qd ^ 2 goes.
      const float v = (upper ? t1 : t0) + __shfl_xor_sync(0xffffffffu, upper ? t0 : t1, 2);
      s = G == 0 ? v : s + v;
    }
    mine[half] = s;
  }
}

// One run's scoring by the two scoring warpgroups (threads 0-255 of the CTA): the run's Q and
// head weights into shared memory, then warpgroup c scores key tiles c, c + 2, ... of the
// run from its ring of TMA-loaded tiles (3 stages, one mbarrier each: full[c]) into the slot's
// rows, the scores of the rows in `run` (bs.n[r] visible keys) at slot[r * row_stride + j].
// loads_before: this warpgroup's tiles loaded over all runs so far (load n goes to stage
// n % kStages and completes phase n / kStages), advanced here. both(): the caller's barrier of
// the 256 scoring threads; kCount: the first radix digit's histogram too (hist [kRows,
// kBins]); stamp_run(phase) / stamp_tile(u, phase): the caller's measurement hooks (no-ops
// outside the stamped instance). The generic writes to Q and w_s come after both(), which
// first orders the previous generic writes of shared memory before this run's TMA writes.
template <int DI, bool kCount, class Both, class StampRun, class StampTile>
__device__ __forceinline__ void score_run(const LayerDims& d, const bf16* qi, const float* w_eff,
                                          const void* key_map, std::uint32_t base, float* w_s,
                                          unsigned* hist, std::uint64_t (&full)[2][kStages],
                                          const idxblock::Shared& bs, unsigned run, int t0, int n_run,
                                          int seg_row0, float* slot, long row_stride, int& loads_before,
                                          float (&acc)[128], Both both, StampRun stamp_run,
                                          StampTile stamp_tile) {
  using L = Layout<DI>;
  constexpr int kChunks = DI / 8, kSteps = DI / 16;
  const int HI = d.index_heads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wtid = tid & 127;
  const int g = lane >> 2, qd = lane & 3;

  // Generic writes into the Q and key buffers before (the select's staging, in the
  // two-warpgroup kernel) against this run's TMA writes (async proxy).
  fence_proxy_async_smem();
  both();  // both warpgroups are done with the previous run's Q, w and stages
  for (int i = tid; i < kCols * kChunks; i += kScoreThreads) {
    const int col = i / kChunks, cc = i % kChunks, r = col / kHeads, h = col % kHeads;
    const bool real = (run >> r & 1u) && h < HI;
    const long src = real ? (static_cast<long>(t0 + r) * HI + h) * DI + cc * 8 : 0;
    cp_async_16_zfill(base + L::kQOff + op_off(col, cc, L::kQBlock), qi + src, real);
  }
  cp_async_commit();
  for (int i = tid; i < kCols; i += kScoreThreads) {
    const int r = i / kHeads, h = i % kHeads;
    w_s[i] = (run >> r & 1u) && h < HI ? w_eff[static_cast<long>(t0 + r) * HI + h] : 0.0f;
  }
  cp_async_wait<0>();
  fence_proxy_async_smem();  // the cp.async writes of Q -> wgmma
  both();
  stamp_run(1);

  const int tiles = (n_run + kKeys - 1) / kKeys;
  const int my_tiles = tiles > wg ? (tiles - wg + 1) / 2 : 0;  // tiles wg, wg + 2, ...
  const std::uint32_t ring = base + L::kKOff + wg * kStages * L::kTileBytes;
  auto stage_of = [&](int u) { return (loads_before + u) % kStages; };
  auto load = [&](int u) {
    const int tile = 2 * u + wg;
    const std::uint32_t dst = ring + stage_of(u) * L::kTileBytes;
    // Rows past the segment's end: other segments' keys or (past comp_capacity) zeros,
    // scored but never stored.
    if (u < my_tiles && wtid == 0) {
      const std::uint32_t bar = smem_addr(&full[wg][stage_of(u)]);
      mbar_arrive_expect_tx(bar, L::kTileBytes);
      const int row = seg_row0 + tile * kKeys;
#pragma unroll
      for (int blk = 0; blk < L::kBlocks; ++blk) tma_load_2d(dst + blk * L::kKBlock, key_map, 64 * blk, row, bar);
    }
  };
  load(0);
  load(1);
  for (int u = 0; u < my_tiles; ++u) {
    stamp_tile(u, 0);
    const int n = loads_before + u;
    mbar_wait(smem_addr(&full[wg][n % kStages]), static_cast<std::uint32_t>(n / kStages) & 1u);
    named_barrier_sync(1 + wg, 128);  // every warp's wgmma of tile u - 1 done: its stage is free
    stamp_tile(u, 1);
    load(u + 2);
    stamp_tile(u, 2);
    const std::uint32_t kt = ring + stage_of(u) * L::kTileBytes;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      const std::uint32_t a = kt + (kk >> 2) * L::kKBlock + (kk & 3) * 32;
      const std::uint32_t b = base + L::kQOff + (kk >> 2) * L::kQBlock + (kk & 3) * 32;
      wgmma_m64n256k16_ss<0>(acc, wgmma_desc_sw128(a, 16, 1024), wgmma_desc_sw128(b, 16, 1024), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(acc);
    stamp_tile(u, 3);

    float mine[2];
    head_sums(acc, w_s, qd, mine);
    stamp_tile(u, 4);
    const int key0 = (2 * u + wg) * kKeys + 16 * (warp & 3) + g;
    if (run >> qd & 1u) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = key0 + 8 * half;
        if (j < bs.n[qd]) {
          slot[qd * row_stride + j] = mine[half];
          if constexpr (kCount)
            atomicAdd(&hist[qd * idxsel::kBins + idxsel::digit0(order_key(mine[half]))], 1u);
        }
      }
    }
    stamp_tile(u, 5);
  }
  loads_before += my_tiles;
}

}  // namespace csattn::cuda::idxwg
