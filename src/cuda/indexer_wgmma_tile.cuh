// What the two wgmma indexer kernels share (indexer_topk_wgmma.cu: two scoring warpgroups
// that then select; indexer_topk_wgmma_overlap.cu: the same scoring beside a selecting
// warpgroup): the shared-memory layout, the operands' swizzled offsets and the epilogue that
// turns a tile's accumulator into the four rows' scores, bit for bit the tiled kernel's.
#pragma once
#include <cstdint>

#include "cuda/indexer_block.cuh"
#include "cuda/indexer_score.cuh"

namespace csattn::cuda::idxwg {

constexpr int kRows = idxblock::kRows;  // query rows per CTA (the scratch slot's rows)
constexpr int kHeads = 64;            // head columns per row; fewer heads are zero-padded
constexpr int kCols = kRows * kHeads; // the wgmma N
static_assert(kCols == 256, "one m64n256 wgmma covers the CTA's rows");
constexpr int kKeys = 64;             // keys per tile (the wgmma M)
constexpr int kStages = 3;            // per scoring warpgroup

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

}  // namespace csattn::cuda::idxwg
