// Warpgroup-MMA sparse attention backward for head_dim 512 (Hopper, sm_90a); the contract of
// launch_attention_backward (backward_kernels.hpp), checked against the CUDA-core baseline.
//
// One CTA per (query token, block of 64 heads), 256 threads = two warpgroups; the heads share
// one K=V head, so each gathered 64-key tile serves all 64 head rows. Per key tile, with P
// recomputed from the forward's LSE (all products bf16 x bf16 -> fp32 wgmma):
//   S  = Q K^T                    [64 heads x 64 keys]  WG0   32 x m64n64k16  (Q, K: smem)
//   dP = dO K^T                   [64 x 64]             WG1   32 x m64n64k16  (dO, K: smem)
//   P  = exp2(S scale log2e - LSE log2e)                WG0 -> bf16 P tile
//   dS = scale P (dP - D_row)     (P as the bf16 tile)  WG1 -> bf16 dS tile, and registers
//   dQ[:, 256c..] += dS K[:, 256c..]                    WG c  4 x m64n256k16 (WG1: dS from
//                                                        registers; WG0: the dS tile)
//   dK[:, 128j..] = P^T dO + dS^T Q  (K = V: key and value terms on one row)
//                                                        WG c, chunks j = 2c, 2c + 1:
//                                                        8 x m64n128k16, A = the P / dS tiles
//                                                        read transposed (MN-major), B = dO / Q
//                                                        read MN-major
// dQ (64 x 512 fp32) stays in registers over the tiles (128 a thread) and is stored once, in
// bf16; each dK chunk
// (64 keys x 128 dims, 64 registers) is flushed as soon as it is complete: vector fp32
// reductions into the key-gradient rows (fast mode), or stores into this CTA's rows of the
// chunk scratch (deterministic mode, grad_chunk.hpp). Every wgmma group is waited for within
// its tile: reading an accumulator after wgmma.wait_group 1 across the loop's back edge (a
// flush of one tile's last chunk overlapping the next tile's S) makes ptxas serialise every
// wgmma of the kernel (C7514).
//
// Shared memory (1024-byte aligned, 128B-swizzle layout of wgmma_tile.cuh):
//   Q, dO, K [64 x 512] 64 KB each | P, dS [64 x 64] 8 KB each | 2 mbarriers | LSE2, D_row |
//   CSA: the compacted top-k row. Key ids are derived per slot (KeyList): no key list is stored,
//   so HCA segments of any length fit.
// One key buffer: WG c gathers the next tile's dims [256c, 256c + 256) (cp.async, completing
// on mbarrier ready[c]) as soon as its own dQ - the last reader of those dims - is done, so
// the gather overlaps both warpgroups' dK. Hand-overs between the warpgroups (named barriers,
// each arrived at by one warpgroup and waited on by the other, once per tile):
//   P ready (WG0 -> WG1), dS ready (WG1 -> WG0), P / dS free (WG1 -> WG0: WG1's dK of the
//   previous tile, the last reader of both tiles besides WG0's own, is complete).
// WG0 and WG1 run separate loops: a loop shared through `if (c == 0)` makes ptxas serialise
// every wgmma (C7514 / C7515).
#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/atomic_util.cuh"
#include "cuda/attention_keys.cuh"
#include "cuda/attention_row_terms.cuh"
#include "cuda/backward_kernels.hpp"
#include "cuda/check.hpp"
#include "cuda/mma_util.cuh"
#include "cuda/phase_stamp.cuh"
#include "cuda/wgmma.cuh"
#include "cuda/wgmma_sync.cuh"
#include "cuda/wgmma_tile.cuh"

namespace csattn::cuda {

namespace {

constexpr int kDim = 512;
constexpr int kRows = 64;  // head rows per CTA (one wgmma M)
constexpr int kKeys = 64;  // keys per tile
constexpr int kThreads = 256;
constexpr int kWgThreads = 128;
constexpr int kBlockBytes = kSwizzleBlockBytes;       // [64 rows x 64 dims] bf16
constexpr int kTileBytes = (kDim / 64) * kBlockBytes;  // [64 x 512] bf16 = 64 KB
constexpr int kQOff = 0;
constexpr int kDoOff = kQOff + kTileBytes;
constexpr int kKOff = kDoOff + kTileBytes;
constexpr int kPOff = kKOff + kTileBytes;
constexpr int kDsOff = kPOff + kBlockBytes;
constexpr int kBarOff = kDsOff + kBlockBytes;  // ready[2]
constexpr int kLseOff = kBarOff + 2 * 8;
constexpr int kDrowOff = kLseOff + kRows * 4;
constexpr int kCountOff = kDrowOff + kRows * 4;   // warp counts of the top-k compaction [8]
constexpr int kSelOff = kCountOff + 8 * 4;
// kLines: per warp [8 rows x 32] fp32 (1 KB) of staging after the top-k row (16-aligned).
constexpr int kStageFloats = 8 * 32;
constexpr int kStageBytes = (kThreads / 32) * kStageFloats * 4;
static_assert(kSelOff % 16 == 0, "the staging area is read as float4");
static_assert(kThreads / 32 <= 8, "make_key_list's warp counts");

// Named barriers (0 is __syncthreads), each over both warpgroups.
constexpr int kBarPReady = 1;   // WG0 -> WG1: the P tile of this key tile is written
constexpr int kBarDsReady = 2;  // WG1 -> WG0: the dS tile is written
constexpr int kBarPdsFree = 3;  // WG1 -> WG0: WG1 no longer reads the P / dS tiles

// Where the key gradients go (mode of the kernel instance).
enum class KeyGrads { atomic, scratch, discard, even_head_blocks };

// Where kLines' staging area starts: after the top-k row, rounded up to 16 bytes.
__host__ __device__ inline int wgmma_backward_stage_off(const LayerDims& d) {
  return kSelOff + (d.ratio == 4 ? (4 * d.topk + 15) / 16 * 16 : 0);
}

std::size_t wgmma_backward_smem_bytes(const LayerDims& d, bool lines) {
  // + 1 KB: the dynamic base is aligned up to 1024 bytes in the kernel.
  return 1024 + static_cast<std::size_t>(wgmma_backward_stage_off(d)) + (lines ? kStageBytes : 0);
}

// dK [64 keys x 128 dims from dim0] = P^T dO + dS^T Q over the 64 head rows. A = the [heads x
// keys] P / dS tiles read MN-major (row = head = the K index, 64 keys along a row), head step
// kk at row 16 kk; B = the dO / Q tiles read MN-major from column block dim0 / 64 (2 blocks,
// LBO = 8 KB). The first product overwrites dK.
__device__ __forceinline__ void dk_chunk(float (&dk)[64], std::uint32_t p_base,
                                         std::uint32_t ds_base, std::uint32_t do_base,
                                         std::uint32_t q_base, int dim0) {
#pragma unroll
  for (int kk = 0; kk < kRows / 16; ++kk) {
    const std::uint32_t a_off = kk * 16 * 128;
    const std::uint32_t b_off = (dim0 / 64) * kBlockBytes + kk * 16 * 128;
    wgmma_m64n128k16_ss<1, 1>(dk, wgmma_desc_sw128(p_base + a_off, kBlockBytes, 1024),
                              wgmma_desc_sw128(do_base + b_off, kBlockBytes, 1024),
                              kk == 0 ? 0 : 1);
    wgmma_m64n128k16_ss<1, 1>(dk, wgmma_desc_sw128(ds_base + a_off, kBlockBytes, 1024),
                              wgmma_desc_sw128(q_base + b_off, kBlockBytes, 1024), 1);
  }
}

// Adds (or stores) one warpgroup's dK chunk: keys slot0 + 16 w + lane / 4 (+8) of the key
// list, dims dim0 + 8 i + 2 (lane % 4) (+1) for i < 16 (the m64n128 accumulator layout). Lane
// pairs (q, q ^ 1) first swap halves in place, so that dk[4i .. 4i + 3] of the even lane are
// dims 8 i + 2 q .. + 3 of row g and those of the odd lane dims 8 i + 2 (q - 1) .. + 3 of row
// g + 8; then one 16-byte reduction (or store) per column group. Slots from `limit` on (the
// last tile's tail past the key list; with GradChunk::window_only the compressed slots) are
// skipped. dk is consumed.
template <KeyGrads kMode>
__device__ __forceinline__ void flush_dk(float (&dk)[64], const KeyList& keys, int limit,
                                         float* dkv_acc, float* dcomp_acc, float* scratch,
                                         int slot0, int dim0, int hb) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3, g = lane >> 2, qd = lane & 3;
  const bool odd = (qd & 1) != 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    // The even lane sends its row g + 8 values (4i + 2, 4i + 3), the odd lane its row g ones.
    const float s0 = odd ? dk[4 * i] : dk[4 * i + 2];
    const float s1 = odd ? dk[4 * i + 1] : dk[4 * i + 3];
    const float r0 = __shfl_xor_sync(0xffffffffu, s0, 1);
    const float r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
    if (odd) {
      dk[4 * i] = r0;
      dk[4 * i + 1] = r1;
    } else {
      dk[4 * i + 2] = r0;
      dk[4 * i + 3] = r1;
    }
  }
  // discard (measurement only) stops here, even_head_blocks (measurement only) for odd head
  // blocks. The test is true whenever the two accumulators are distinct buffers (always), but
  // ptxas cannot know it, so it must keep the dK products: it drops wgmmas whose accumulators
  // nothing reads.
  if ((kMode == KeyGrads::discard || (kMode == KeyGrads::even_head_blocks && (hb & 1) != 0)) &&
      dkv_acc != dcomp_acc)
    return;
  const int slot = slot0 + 16 * w + g + (odd ? 8 : 0);
  if (slot >= limit) return;
  float* row = kMode == KeyGrads::scratch ? scratch + static_cast<long>(slot) * kDim
                                          : key_grad_row(keys.id(slot), dkv_acc, dcomp_acc, kDim);
  row += dim0 + 2 * (qd & ~1);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    if (kMode == KeyGrads::scratch)  // this CTA's own row: a plain store
      *reinterpret_cast<float4*>(row + 8 * i) =
          make_float4(dk[4 * i], dk[4 * i + 1], dk[4 * i + 2], dk[4 * i + 3]);
    else
      red_add_v4(row + 8 * i, dk[4 * i], dk[4 * i + 1], dk[4 * i + 2], dk[4 * i + 3]);
  }
}

// flush_dk's contract (fast and deterministic modes), by whole 128-byte lines: the chunk goes
// through this warp's staging area `stage` ([8 rows x 32] fp32 of shared memory, its 16-byte
// pieces XOR-swizzled by 2 x row so the fragment writes take the minimum two wavefronts; the
// layout of line_stage.cuh, kept inline here as measured),
// 8 rows x 32 dims at a time, and leaves it as 4 rows x 128 contiguous bytes a warp
// instruction, where flush_dk's fragment layout gives 16 rows x 32 bytes. The reductions
// benchmark (perf.md, 2026-12-05): 3.75 TB/s in L2 for whole lines against 2.27 for the
// fragment layout. In the kernel it costs 64 KB of shared-memory traffic per warpgroup and tile
// and still wins: the attention backward is 17-31% faster with it (perf.md, 2026-12-06).
template <KeyGrads kMode>
__device__ __forceinline__ void flush_dk_lines(const float (&dk)[64], const KeyList& keys,
                                               int limit, float* dkv_acc, float* dcomp_acc,
                                               float* scratch, int slot0, int dim0, float* stage) {
  static_assert(kMode == KeyGrads::atomic || kMode == KeyGrads::scratch, "the writing modes only");
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3, g = lane >> 2, qd = lane & 3;
  // Out: lane l takes staged rows l / 8 and l / 8 + 4, 16-byte piece l % 8 (dims 4 (l % 8) ..
  // + 3 of the 32); staged row r of half h is key slot slot0 + 16 w + 8 h + r.
  const int rr = lane >> 3, piece = lane & 7;
  float* dst[2][2];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int slot = slot0 + 16 * w + 8 * h + rr + 4 * k;
      float* row = nullptr;
      if (slot < limit)
        row = (kMode == KeyGrads::scratch ? scratch + static_cast<long>(slot) * kDim
                                          : key_grad_row(keys.id(slot), dkv_acc, dcomp_acc, kDim)) +
              dim0 + 4 * piece;
      dst[h][k] = row;
    }
  auto at = [&](int row, int piece16) { return stage + row * 32 + (((piece16 ^ (2 * row)) & 7) << 2); };
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      // In: lane (g, q) holds dims 8 i + 2 q (+1) of row g + 8 h at dk[4 i + 2 h] (i = 4 m + j).
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = 4 * m + j, col = 8 * j + 2 * qd;
        *reinterpret_cast<float2*>(at(g, col >> 2) + (col & 3)) = make_float2(dk[4 * i + 2 * h], dk[4 * i + 2 * h + 1]);
      }
      __syncwarp();
      // Both rows' pieces loaded before either reduction: loaded inside the loop below, each
      // load sat in its reduction's branch and each reduction waited out its own load (the
      // H200 profile, perf.md twenty-third session: the flush's REDG waiting on its LDS).
      float4 v[2];
#pragma unroll
      for (int k = 0; k < 2; ++k) v[k] = *reinterpret_cast<const float4*>(at(rr + 4 * k, piece));
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        if (kMode == KeyGrads::scratch) {  // this CTA's own row: a plain store
          if (dst[h][k] != nullptr) *reinterpret_cast<float4*>(dst[h][k] + 32 * m) = v[k];
        } else {
          red_add_v4_if(dst[h][k] != nullptr, reinterpret_cast<std::uint64_t>(dst[h][k]) + 128 * m, v[k].x, v[k].y,
                        v[k].z, v[k].w);
        }
      }
      __syncwarp();  // the staging area is rewritten next
    }
}

// The rotated tile order (fast mode): key tiles done by all CTAs of all launches so far. A
// CTA starts its (ascending) key list at tile (done / SMs) mod tiles - the phase the CTAs
// already running have reached - so the CTAs in flight work on the same part of every row's
// sorted top-k list, i.e. on the same ~1/tiles of the compressed keys, and their dK
// reductions stay in L2 (at 64K keys the dK rows, 128 MB of fp32, miss L2). Measured on an
// H100 (perf.md, fifteenth session): Pro 306/272 -> 320/286 TFLOPS at 32K/64K keys, Flash
// 222/187 -> 244/198; at 8K keys, where the dK rows fit L2, 1.5-2% slower (noise level).
// The order of a CTA's dQ sum then depends on timing: fast mode only (its dK sums are
// unordered anyway); the deterministic mode keeps the key tiles in order.
__device__ unsigned g_backward_tiles_done = 0;

// kStamps (measurement only): clock() at the phase boundaries into `stamps`, laid out as
// AttentionBackwardStamps (backward_kernels.hpp) says. kLines: the dK chunks leave through
// flush_dk_lines (the default where its staging area fits) instead of flush_dk. rotate: the
// rotated tile order above (atomic mode): the multiprocessor count (one CTA an SM), 0 = off.
template <KeyGrads kMode, bool kStamps, bool kLines>
__global__ void __launch_bounds__(kThreads, 1)
    attention_backward_wgmma_kernel(LayerDims d, DeviceMetadata meta, const bf16* q,
                                    const bf16* kv, const bf16* comp, const float* sink,
                                    const std::int32_t* topk, OutputRows out, const float* lse,
                                    const bf16* dout, bf16* dq_out, float* dkv_acc,
                                    float* dcomp_acc, float* dsink_part, int head_blocks,
                                    GradChunk chunk, unsigned* stamps, int rotate) {
  extern __shared__ unsigned char smem_raw[];
  __shared__ unsigned phase_s;
  unsigned char* smem = smem_raw + align_1024_pad(smem_raw);  // wgmma's swizzle atoms
  const std::uint32_t base = smem_addr(smem);
  const std::uint32_t q_base = base + kQOff, do_base = base + kDoOff, k_base = base + kKOff;
  const std::uint32_t p_base = base + kPOff, ds_base = base + kDsOff;
  const std::uint32_t ready0 = base + kBarOff, ready1 = ready0 + 8;
  float* lse2_s = reinterpret_cast<float*>(smem + kLseOff);
  float* drow_s = reinterpret_cast<float*>(smem + kDrowOff);

  const int H = d.heads;
  // The head blocks of a token are neighbouring CTAs: they gather the same key rows and add
  // into the same key-gradient rows close in time, in L2 (a head-block-major order measured
  // 14% slower at 128 heads, 64K keys; perf.md 2026-12-04).
  const int hb = static_cast<int>(blockIdx.x % head_blocks), h0 = hb * kRows;
  const int t = chunk.r0 + static_cast<int>(blockIdx.x / head_blocks);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int c = warp >> 2;  // warpgroup
  using Stamps = AttentionBackwardStamps;
  auto stamp_at = [&](int row, int phase) {
    if constexpr (kStamps)
      write_phase_stamp<Stamps::ctas, 2, Stamps::tiles + 1, Stamps::phases>(stamps, row, phase);
  };
  auto stamp = [&](int tile, int phase) {  // key tile `tile`
    if (tile < Stamps::tiles) stamp_at(tile, phase);
  };
  stamp_at(Stamps::tiles, 0);

  if (tid == 0) {
    mbar_init(ready0, kWgThreads);  // one cp.async arrival per thread of the gathering WG
    mbar_init(ready1, kWgThreads);
    mbar_init_fence();
    if (kMode == KeyGrads::atomic && rotate > 0)
      phase_s = *reinterpret_cast<volatile unsigned*>(&g_backward_tiles_done) / static_cast<unsigned>(rotate);
  }
  // Q and dO rows h0 .. h0 + 63 (zero-filled past H), issued first: they depend on nothing
  // the key list gives, so their device-memory latency overlaps its top-k row's.
  for (int i = tid; i < kRows * 64; i += kThreads) {
    const int r = i >> 6, ch = i & 63;
    const bool real = h0 + r < H;
    const long off = (static_cast<long>(t) * H + (real ? h0 + r : 0)) * kDim + ch * 8;
    cp_async_16_zfill(q_base + tile_off(r, ch), q + off, real);
    cp_async_16_zfill(do_base + tile_off(r, ch), dout + off, real);
  }
  // (make_key_list ends with __syncthreads: the barriers are initialised for everyone.)
  const KeyList keys = make_key_list<kThreads>(d, meta, topk, t, reinterpret_cast<int*>(smem + kSelOff),
                                     reinterpret_cast<int*>(smem + kCountOff));
  const int n = keys.n;
  const int tiles = (n + kKeys - 1) / kKeys;
  // Iteration i works on key tile key_tile(i): i itself, or rotated (fast mode, `rotate`).
  const bool counting = kMode == KeyGrads::atomic && rotate > 0;  // every tile counts
  const bool rotated = counting && tiles > 1;
  const int rot = rotated ? static_cast<int>(phase_s % static_cast<unsigned>(tiles)) : 0;
  auto key_tile = [&](int i) { return i + rot < tiles ? i + rot : i + rot - tiles; };
  // The slots whose dK leave the CTA: all, or (GradChunk::window_only) the window's.
  const int flush_limit = kMode == KeyGrads::scratch && chunk.window_only ? keys.n_win : n;

  // Warpgroup c gathers dims [256c, 256c + 256) of key tile `tile`: warp w of the group rows
  // 16 w .. 16 w + 15, lane l the 16-byte chunk l of each (a row's half is 512 contiguous
  // bytes). Slots past the list load a real row (finite; its P is masked to 0).
  const int w4 = warp & 3;
  auto gather = [&](int tile) {
    const int slot = tile * kKeys + 16 * w4 + (lane & 15);
    const bf16* mine = key_row_ptr(keys.id(slot < n ? slot : 0), kv, comp, kDim);
#pragma unroll 4
    for (int j = 0; j < 16; ++j) {
      const bf16* src = reinterpret_cast<const bf16*>(
          __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(mine), j));
      cp_async_16(k_base + tile_off(16 * w4 + j, 32 * c + lane), src + (32 * c + lane) * 8);
    }
    cp_async_mbar_arrive(c == 0 ? ready0 : ready1);
  };
  gather(key_tile(0));

  attention_row_terms<kThreads / 32, kDim>(H, t, h0, out, dout, lse, sink, dsink_part, drow_s, lse2_s);
  cp_async_wait_all();  // this thread's Q / dO copies
  fence_proxy_async_smem();
  __syncthreads();
  stamp_at(Stamps::tiles, 1);

  const int g = lane >> 2, qd = lane & 3;
  const int row0 = 16 * w4 + g, row1 = row0 + 8;
  const float scale = d.scale, scale2 = d.scale * kAttentionLog2e;
  float* scratch = nullptr;
  if (kMode == KeyGrads::scratch)  // rows (query, head block, slot) of the chunk's scratch
    scratch = chunk.scratch +
              static_cast<long>((t - chunk.r0) * chunk.copies + hb) * chunk.slots * kDim;

  float dq[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) dq[i] = 0.0f;
  float dk[64];
  float s[32];
  std::uint32_t p[16];  // WG0: P; WG1: dS (bf16 pairs, the A fragment layout)

  // What both warpgroups do with key tile `tile`, each in its own loop (the calls inline;
  // one loop shared through `if (c == 0)` would serialise the wgmmas).
  // Waits for the tile and computes A K^T over all 512 dims into s (A = Q: S; A = dO: dP).
  auto scores_of_tile = [&](int tile, std::uint32_t a_base) {
    const std::uint32_t parity = tile & 1;
    stamp(tile, 0);
    mbar_wait(ready0, parity);
    mbar_wait(ready1, parity);
    stamp(tile, 1);
    fence_proxy_async_smem();
    wgmma_fence();
    qk_half(s, a_base, k_base, 0, true);
    qk_half(s, a_base, k_base, 1, false);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(s);
    stamp(tile, 2);
  };
  // After this warpgroup issued its dQ and its first dK chunk (dims dim0 .. + 128, dim0 =
  // 256c): once dQ - the last read of the tile's dims [dim0, +256) - is done, the next tile's
  // half is gathered; then both dK chunks are flushed, the second computed after the first's
  // flush. WG1 (frees_pds) frees the P / dS tiles as soon as its last product has read them.
  float* stage = reinterpret_cast<float*>(smem + wgmma_backward_stage_off(d)) + (threadIdx.x >> 5) * kStageFloats;
  // (tile: the iteration; its keys are key tile key_tile(tile).)
  auto finish_tile = [&](int tile, int dim0, bool frees_pds) {
    const int slot0 = key_tile(tile) * kKeys;
    auto flush = [&](int dims) {
      if constexpr (kLines)
        flush_dk_lines<kMode>(dk, keys, flush_limit, dkv_acc, dcomp_acc, scratch, slot0, dims, stage);
      else
        flush_dk<kMode>(dk, keys, flush_limit, dkv_acc, dcomp_acc, scratch, slot0, dims, hb);
    };
    wgmma_wait<1>();
    wgmma_pin(dq);
    stamp(tile, 4);
    if (tile + 1 < tiles) gather(key_tile(tile + 1));
    wgmma_wait<0>();
    wgmma_pin(dk);
    stamp(tile, 5);
    flush(dim0);
    stamp(tile, 6);
    wgmma_fence();
    dk_chunk(dk, p_base, ds_base, do_base, q_base, dim0 + 128);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(dk);
    if (frees_pds) named_barrier_arrive(kBarPdsFree, kThreads);
    flush(dim0 + 128);
    stamp(tile, 7);
    // One count a tile (WG0's first thread) for the rotated order's phase.
    if (counting && threadIdx.x == 0) atomicAdd(&g_backward_tiles_done, 1u);
  };
  // After this warpgroup issued its dQ: its dK chunks (dims dim0 ..) and finish_tile. A tile
  // with no slot below flush_limit (GradChunk::window_only: a compressed tile, whose dK the
  // keyed pass computes) skips its dK products: only dQ is waited for, then the next gather
  // is issued and (WG1) the P / dS tiles freed - WG1's last read of them was its dS.
  auto dk_and_finish = [&](int tile, int dim0, bool frees_pds) {
    if (kMode != KeyGrads::scratch || key_tile(tile) * kKeys < flush_limit) {
      dk_chunk(dk, p_base, ds_base, do_base, q_base, dim0);
      wgmma_commit();
      finish_tile(tile, dim0, frees_pds);
      return;
    }
    wgmma_wait<0>();
    wgmma_pin(dq);
    if (tile + 1 < tiles) gather(key_tile(tile + 1));
    if (frees_pds) named_barrier_arrive(kBarPdsFree, kThreads);
  };

  if (c == 0) {
    // ---------------- WG0: S, P; dQ and dK for dims 0-255 ----------------
    for (int tile = 0; tile < tiles; ++tile) {
      scores_of_tile(tile, q_base);  // S

      const float l2a = lse2_s[row0], l2b = lse2_s[row1];
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int key = key_tile(tile) * kKeys + 8 * (j >> 2) + 2 * qd + (j & 1);
        s[j] = key < n ? exp2_ftz(fmaf(s[j], scale2, -((j & 2) ? l2b : l2a))) : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 16; ++j) p[j] = pack_bf16(s[2 * j], s[2 * j + 1]);
      named_barrier_sync(kBarPdsFree, kThreads);  // WG1's previous dK is done with P / dS
      store_fragment(smem + kPOff, p, row0, qd);
      fence_proxy_async_smem();  // st.shared -> wgmma (both warpgroups' dK)
      named_barrier_arrive(kBarPReady, kThreads);
      named_barrier_sync(kBarDsReady, kThreads);
      stamp(tile, 3);

      wgmma_fence();
      pv_half_smem(dq, ds_base, k_base, 0);  // dQ += dS K
      wgmma_commit();
      dk_and_finish(tile, 0, false);
    }
    named_barrier_sync(kBarPdsFree, kThreads);  // WG1's last arrival
  } else {
    // ---------------- WG1: dP, dS; dQ and dK for dims 256-511 ----------------
    named_barrier_arrive(kBarPdsFree, kThreads);  // the P / dS tiles start free
    for (int tile = 0; tile < tiles; ++tile) {
      scores_of_tile(tile, do_base);  // dP

      // dS = scale P (dP - D_row), P as WG0 stored it (bf16: the value dK's P^T dO uses).
      named_barrier_sync(kBarPReady, kThreads);
      const float da = drow_s[row0], db = drow_s[row1];
      const unsigned char* p_tile = smem + kPOff;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int row = (j & 1) ? row1 : row0;
        const std::uint32_t pv =
            *reinterpret_cast<const std::uint32_t*>(p_tile + fragment_off(row, j >> 1, qd));
        const float2 pf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pv));
        const float dr = (j & 1) ? db : da;
        p[j] = pack_bf16(scale * pf.x * (s[2 * j] - dr), scale * pf.y * (s[2 * j + 1] - dr));
      }
      store_fragment(smem + kDsOff, p, row0, qd);
      fence_proxy_async_smem();  // st.shared -> wgmma (WG0's dQ, both warpgroups' dK)
      named_barrier_arrive(kBarDsReady, kThreads);
      stamp(tile, 3);

      wgmma_fence();
      pv_half_regs(dq, p, k_base, 1);  // dQ += dS K
      wgmma_commit();
      dk_and_finish(tile, 256, true);
    }
  }

  stamp_at(Stamps::tiles, 2);
  // dQ: warpgroup c's dims [256c, 256c + 256), rounded to bf16 (this CTA holds the whole sum);
  // rows past H are never written.
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int dim = 256 * c + 8 * i + 2 * qd;
    if (h0 + row0 < H)
      *reinterpret_cast<__nv_bfloat162*>(dq_out + (static_cast<long>(t) * H + h0 + row0) * kDim + dim) =
          __floats2bfloat162_rn(dq[4 * i], dq[4 * i + 1]);
    if (h0 + row1 < H)
      *reinterpret_cast<__nv_bfloat162*>(dq_out + (static_cast<long>(t) * H + h0 + row1) * kDim + dim) =
          __floats2bfloat162_rn(dq[4 * i + 2], dq[4 * i + 3]);
  }
  stamp_at(Stamps::tiles, 3);
}

}  // namespace

bool attention_backward_wgmma_supported(const LayerDims& d) {
  // The atomic instances have the most static shared memory (16 B: the rotated order's phase;
  // the others none): the default one speaks for all.
  return d.head_dim == kDim &&
         wgmma_backward_smem_bytes(d, false) <=
             dynamic_smem_limit(attention_backward_wgmma_kernel<KeyGrads::atomic, false, false>);
}

void launch_attention_backward_wgmma(const LayerDims& d, const DeviceMetadata& meta, const bf16* q,
                                     const bf16* kv, const bf16* comp, const float* sink,
                                     const std::int32_t* topk, OutputRows out, const float* lse,
                                     const bf16* dout, bf16* dq_out, float* dkv_acc,
                                     float* dcomp_acc, float* dsink_part, cudaStream_t stream,
                                     const GradChunk& chunk, KeyGradWrites writes,
                                     unsigned* phase_stamps) {
  check_output_rows(d, out);
  const int rows = chunk.launch_rows(d.rows);
  if (rows <= 0) return;
  require(d.head_dim == kDim, ErrorKind::Unsupported,
          "the wgmma attention backward needs head_dim 512, got " + std::to_string(d.head_dim));
  // The dK chunks leave by whole 128-byte lines (flush_dk_lines) in the modes that write them
  // all: 17-31% faster end to end than the fragment flush (perf.md, 2026-12-06 fourteenth
  // session). Where the staging area does not fit beside a long top-k row, and in the
  // partial-write measurement modes, the fragment flush.
  const bool by_lines = (phase_stamps != nullptr || writes == KeyGradWrites::all) &&
                        wgmma_backward_smem_bytes(d, true) <=
                            dynamic_smem_limit(attention_backward_wgmma_kernel<KeyGrads::atomic, false, true>);
  const std::size_t smem = wgmma_backward_smem_bytes(d, by_lines);
  const bool measuring = writes != KeyGradWrites::all;
  require(!measuring || (chunk.scratch == nullptr && dkv_acc != nullptr && dcomp_acc != nullptr &&
                         dkv_acc != dcomp_acc),
          ErrorKind::InvalidArgument,
          "the wgmma attention backward's partial-write modes (measurements) run in the fast mode "
          "with two distinct key-gradient buffers");
  require(phase_stamps == nullptr || (chunk.scratch == nullptr && !measuring),
          ErrorKind::InvalidArgument,
          "the wgmma attention backward's phase stamps are taken in the fast mode only");
  auto kernel =
      phase_stamps != nullptr ? (by_lines ? attention_backward_wgmma_kernel<KeyGrads::atomic, true, true>
                                          : attention_backward_wgmma_kernel<KeyGrads::atomic, true, false>)
      : writes == KeyGradWrites::none ? attention_backward_wgmma_kernel<KeyGrads::discard, false, false>
      : writes == KeyGradWrites::even_head_blocks
          ? attention_backward_wgmma_kernel<KeyGrads::even_head_blocks, false, false>
      : chunk.scratch ? (by_lines ? attention_backward_wgmma_kernel<KeyGrads::scratch, false, true>
                                  : attention_backward_wgmma_kernel<KeyGrads::scratch, false, false>)
      : by_lines ? attention_backward_wgmma_kernel<KeyGrads::atomic, false, true>
                 : attention_backward_wgmma_kernel<KeyGrads::atomic, false, false>;
  allow_dynamic_smem(kernel, smem,
                     "the wgmma attention backward (its shared memory grows with index_topk)");
  const int head_blocks = (d.heads + kRows - 1) / kRows;
  const long blocks = static_cast<long>(rows) * head_blocks;
  require(blocks < (1l << 31), ErrorKind::Unsupported, "too many attention rows for one launch");
  // The rotated tile order: the fast mode's launches without stamps (the stamps' rows stay
  // the key tiles in order).
  const int rotate = chunk.scratch == nullptr && writes == KeyGradWrites::all && phase_stamps == nullptr
                         ? multiprocessor_count()
                         : 0;
  kernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(
      d, meta, q, kv, comp, sink, topk, out, lse, dout, dq_out, dkv_acc, dcomp_acc, dsink_part,
      head_blocks, chunk, phase_stamps, rotate);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
