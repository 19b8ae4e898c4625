// Shared-memory tiles in the layout wgmma reads with 128-byte swizzle (see wgmma.cuh), as the
// attention kernels keep them: a [rows x 512] bf16 tile is 8 column blocks of [rows x 64 dims]
// (rows x 128 bytes each), row r of a block at r * 128, its 16-byte chunk c at c ^ (r % 8).
// A [64 x 64] bf16 tile (P, dS) is one such block.
#pragma once
#include <cstdint>

namespace csattn::cuda {

constexpr int kSwizzleBlockBytes = 64 * 128;  // one [64 rows x 64 dims] bf16 column block

// Byte offset of 16-byte chunk `chunk` (0..63) of row `row` (0..63) in a [64 x 512] tile.
__device__ __forceinline__ std::uint32_t tile_off(int row, int chunk) {
  return static_cast<std::uint32_t>((chunk >> 3) * kSwizzleBlockBytes + row * 128 +
                                    (((chunk & 7) ^ (row & 7)) << 4));
}

// Byte offset of the bf16 pair at row `row`, columns 8 i + 2 qd, +1 of a [64 x 64] tile: where
// a thread's accumulator fragment of an m64n64 wgmma (rows 16 w + lane / 4 (+8), see wgmma.cuh)
// lives once packed to bf16 pairs.
__device__ __forceinline__ std::uint32_t fragment_off(int row, int i, int qd) {
  return static_cast<std::uint32_t>(row * 128 + ((i ^ (row & 7)) << 4) + qd * 4);
}

// Writes a thread's packed m64n64 fragment (p[2i]: row0, columns 8i + 2qd; p[2i + 1]: row0 + 8)
// into a swizzled [64 x 64] tile.
__device__ __forceinline__ void store_fragment(unsigned char* tile, const std::uint32_t (&p)[16],
                                               int row0, int qd) {
  const int row1 = row0 + 8;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    *reinterpret_cast<std::uint32_t*>(tile + fragment_off(row0, i, qd)) = p[2 * i];
    *reinterpret_cast<std::uint32_t*>(tile + fragment_off(row1, i, qd)) = p[2 * i + 1];
  }
}

}  // namespace csattn::cuda
