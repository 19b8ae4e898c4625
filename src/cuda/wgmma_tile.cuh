// Shared-memory tiles in the layout wgmma reads with 128-byte swizzle (see wgmma.cuh), as the
// attention kernels keep them: a [rows x 512] bf16 tile is 8 column blocks of [rows x 64 dims]
// (rows x 128 bytes each), row r of a block at r * 128, its 16-byte chunk c at c ^ (r % 8).
// A [64 x 64] bf16 tile (P, dS) is one such block. Also the two products the attention kernels
// build from such tiles, forward and backward: S = A K^T and O += P V (V = the key tile).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/wgmma.cuh"
#include "cuda/wgmma_sync.cuh"

namespace csattn::cuda {

constexpr int kSwizzleBlockBytes = 64 * 128;  // one [64 rows x 64 dims] bf16 column block
constexpr int kSwizzleHalfBytes = 4 * kSwizzleBlockBytes;  // dims 0-255 or 256-511 of a tile

// Byte offset of 16-byte chunk `chunk` (0..63) of row `row` (0..63) in a [64 x 512] tile.
__device__ __forceinline__ std::uint32_t tile_off(int row, int chunk) {
  return static_cast<std::uint32_t>((chunk >> 3) * kSwizzleBlockBytes + row * 128 +
                                    (((chunk & 7) ^ (row & 7)) << 4));
}

// The Q tile of a work item (token t, head rows h0 .. h0 + 63 of H, 512 dims each) into a
// [64 x 512] tile at shared address `dst` by 16-byte copies over kThreads threads (`tid`):
// copy(dst, src, real) issues one (a cp.async that zero-fills where `real` is false: rows past
// H). The caller commits / tracks.
template <int kThreads, class Copy>
__device__ __forceinline__ void load_q_tile_by(std::uint32_t dst, const __nv_bfloat16* q, int t, int H, int h0,
                                               int tid, Copy copy) {
  for (int i = tid; i < 64 * 64; i += kThreads) {
    const int r = i >> 6, c = i & 63;
    const bool real = h0 + r < H;
    copy(dst + tile_off(r, c), q + (static_cast<long>(t) * H + (real ? h0 + r : 0)) * 512 + c * 8, real);
  }
}
template <int kThreads>
__device__ __forceinline__ void load_q_tile(std::uint32_t dst, const __nv_bfloat16* q, int t, int H, int h0,
                                            int tid) {
  load_q_tile_by<kThreads>(dst, q, t, H, h0, tid,
                           [](std::uint32_t to, const void* from, bool real) { cp_async_16_zfill(to, from, real); });
}
// With an L2 cache policy on the reads (Q read once a launch: l2_evict_first_policy).
template <int kThreads>
__device__ __forceinline__ void load_q_tile(std::uint32_t dst, const __nv_bfloat16* q, int t, int H, int h0,
                                            int tid, std::uint64_t policy) {
  load_q_tile_by<kThreads>(dst, q, t, H, h0, tid, [policy](std::uint32_t to, const void* from, bool real) {
    cp_async_16_zfill_hint(to, from, real, policy);
  });
}

// A persistent kernel's next work item into L2 while this one runs (its set-up then waits on
// L2, not device memory): the Q rows of token nt, head rows nh .. (up to 64 of H), and, with
// a top-k (K ids a row, null: none), its top-k row.
template <int kThreads>
__device__ __forceinline__ void prefetch_item_l2(const __nv_bfloat16* q, const std::int32_t* topk,
                                                 int K, int nt, int H, int nh, int tid) {
  const char* qn = reinterpret_cast<const char*>(q + (static_cast<long>(nt) * H + nh) * 512);
  const int q_lines = min(64, H - nh) * (512 * 2 / 128);
  for (int i = tid; i < q_lines; i += kThreads) prefetch_l2(qn + i * 128);
  if (topk != nullptr) {
    const char* tn = reinterpret_cast<const char*>(topk + static_cast<long>(nt) * K);
    for (int i = tid; i < (K * 4 + 127) / 128; i += kThreads) prefetch_l2(tn + i * 128);
  }
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

// S [64 rows x 64 keys] (+)= A K^T over the 256 dims of half `half` (16 k16 steps, 4 per
// 64-dim column block): A (Q or dO) and K are [64 x 512] tiles, both K-major. With `first`,
// the first step overwrites S.
__device__ __forceinline__ void qk_half(float (&s)[32], std::uint32_t a_base, std::uint32_t k_base,
                                        int half, bool first) {
#pragma unroll
  for (int kk = 0; kk < 16; ++kk) {
    const std::uint32_t off = (4 * half + (kk >> 2)) * kSwizzleBlockBytes + (kk & 3) * 32;
    wgmma_m64n64k16_ss<0>(s, wgmma_desc_sw128(a_base + off, 16, 1024),
                          wgmma_desc_sw128(k_base + off, 16, 1024), first && kk == 0 ? 0 : 1);
  }
}

// O [64 x 256] += P [64 x 64 keys] V [64 keys x the 256 dims of half `half`], V = a key tile
// read MN-major (key step kk at row 16 kk, 2 KB; its 4 column blocks LBO = 8 KB apart), P from
// registers (p[4kk .. 4kk + 3]: step kk's A fragment, a packed m64n64 accumulator). The
// forward's P V, the backward's dQ += dS K.
__device__ __forceinline__ void pv_half_regs(float (&o)[128], const std::uint32_t (&p)[16],
                                             std::uint32_t v_base, int half) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const std::uint32_t a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
    wgmma_m64n256k16_rs<1>(o, a,
                           wgmma_desc_sw128(v_base + half * kSwizzleHalfBytes + kk * 16 * 128,
                                            kSwizzleBlockBytes, 1024));
  }
}

// The same with P from shared memory (a swizzled [64 x 64] bf16 tile, K-major).
__device__ __forceinline__ void pv_half_smem(float (&o)[128], std::uint32_t p_base,
                                             std::uint32_t v_base, int half) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    wgmma_m64n256k16_ss<1>(o, wgmma_desc_sw128(p_base + kk * 32, 16, 1024),
                           wgmma_desc_sw128(v_base + half * kSwizzleHalfBytes + kk * 16 * 128,
                                            kSwizzleBlockBytes, 1024),
                           1);
}

}  // namespace csattn::cuda
