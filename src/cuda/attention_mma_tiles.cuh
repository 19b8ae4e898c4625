// The shared-memory tile layouts of the mma.sync attention backward kernel
// (attention_backward_mma.cu): [rows, 512] bf16 tiles of Q, dO and keys read by ldmatrix, and
// the [64 x 32] bf16 P / dS tiles.
#pragma once

namespace csattn::cuda::mma_tiles {

constexpr int kDim = 512;
constexpr int kRowBytes = kDim * 2;
constexpr int kChunks = kDim / 8;  // 16-byte chunks per [*, 512] row
constexpr int kTileKeys = 32;      // keys a P / dS tile row holds
constexpr int kTileRowBytes = kTileKeys * 2;

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled [rows, 512] bf16 tile: the
// XOR spreads the 8 rows an ldmatrix reads at one logical chunk over 8 distinct bank groups.
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * kRowBytes + ((chunk ^ (row & 7)) << 4);
}
// The same for the [64 x 32] bf16 P / dS tiles (64-byte rows, 4 chunks): two rows share a
// 128-byte bank line, so the XOR uses row bits 1-2; 8 consecutive rows at one logical chunk
// land on 8 distinct 16-byte bank groups (plain and transposed ldmatrix alike).
__device__ __forceinline__ int pswz(int row, int chunk) {
  return row * kTileRowBytes + ((chunk ^ ((row >> 1) & 3)) << 4);
}

}  // namespace csattn::cuda::mma_tiles
