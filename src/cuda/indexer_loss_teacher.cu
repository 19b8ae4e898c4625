// The sparse indexer loss's teacher on wgmma (head_dim 512, Hopper sm_90a): for every query row
// whose top-k ids are all visible (the rows whose loss takes its denominator from the forward
// attention's LSE), the mass of each candidate j - the row's valid top-k ids in order -
//     mass_j = sum_h exp(scale * q_h . K_j - LSE_h)
// into kept[(t * topk + j) * 2] (launch_indexer_loss's `kept`); the tensor-core loss kernel
// then takes those masses instead of its own mma.sync teacher pass (indexer_loss_mma.cu,
// `masses_given`). That pass gathers the same 1 KB rows and computes the same Q K^T as the
// attention forward, at ~70 TFLOPS; this kernel is the attention forward's structure without
// P V: it should run at the rate the gathers allow.
//
// Work item = (query row, block of 64 heads); persistent grid, one CTA per SM. Three
// warpgroups:
//   WG0, producer: compacts the row's valid top-k ids, decides whether the row is served (no
//     id at or past the visible count, at least one candidate), loads Q (64 x 512) once the
//     consumers' last S of the previous item read it, and gathers the candidates' compressed
//     rows in 64-key tiles into two buffers (16-byte cp.async, completion on `ready`, refill
//     after `free`), tile k of the whole run into buffer k % 2.
//   WG1, WG2, consumers: consumer c takes the tiles of buffer c: S = Q K^T over 512 dims
//     (32 x wgmma m64n64k16), frees the buffer, then P = exp2(S log2e scale - LSE_h log2e)
//     (zero past the candidates and for head rows past H) and the column sums over the 64
//     head rows: lanes, then the four warps in order (a fixed order: bitwise repeatable).
//     A row of 128 heads is two items whose two partial masses meet by atomicAdd on a zeroed
//     entry: (0 + a) + b and (0 + b) + a are the same float, so still repeatable.
// Shared memory (1024-byte aligned, 128-byte-swizzle atoms as wgmma_tile.cuh): Q 64 KB | key
// buffers 2 x 64 KB | barriers | column partials [2 consumers][2 tiles][4 warps][64] | the
// item's key count, producer warp counts | compacted ids [topk].
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/attention_keys.cuh"
#include "cuda/backward_kernels.hpp"
#include "cuda/check.hpp"
#include "cuda/mma_util.cuh"
#include "cuda/wgmma.cuh"
#include "cuda/wgmma_sync.cuh"
#include "cuda/wgmma_tile.cuh"

namespace csattn::cuda {

namespace {

constexpr int kDim = 512;
constexpr int kRows = 64;   // head rows per item (one wgmma M)
constexpr int kKeys = 64;   // candidates per tile
constexpr int kProducerThreads = 128;
constexpr int kConsumerThreads = 256;
constexpr int kThreads = kProducerThreads + kConsumerThreads;
constexpr int kTileBytes = (kDim / 64) * kSwizzleBlockBytes;  // [64 x 512] bf16 = 64 KB
constexpr int kQOff = 0;
constexpr int kKOff = kQOff + kTileBytes;
constexpr int kBarOff = kKOff + 2 * kTileBytes;          // ready[2], free[2], q_full, q_empty
constexpr int kPartOff = kBarOff + 6 * 8;                // [2][2][4][64] f32
constexpr int kItemOff = kPartOff + 2 * 2 * 4 * kKeys * 4;  // key counts [2]
constexpr int kCountOff = kItemOff + 2 * 4;              // producer warp counts [4]
constexpr int kMaxIdOff = kCountOff + (kProducerThreads / 32) * 4;  // producer warp maxima [4]
constexpr int kSelOff = kMaxIdOff + (kProducerThreads / 32) * 4;    // compacted ids [topk]
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kProducerBar = 1;
constexpr int kConsumerBar0 = 2;  // consumer c's own barrier: kConsumerBar0 + c

std::size_t teacher_smem_bytes(const LayerDims& d) {
  return 1024 + kSelOff + sizeof(int) * static_cast<std::size_t>(std::max(d.topk, 1));
}

__global__ void __launch_bounds__(kThreads, 1)
    indexer_teacher_wgmma_kernel(LayerDims d, DeviceMetadata meta, const bf16* q, const bf16* comp,
                                 const std::int32_t* topk, const float* lse, float* kept,
                                 int head_blocks, int items) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + align_1024_pad(smem_raw);  // wgmma's swizzle atoms
  const std::uint32_t base = smem_addr(smem);
  float* part = reinterpret_cast<float*>(smem + kPartOff);
  int* item_keys = reinterpret_cast<int*>(smem + kItemOff);
  int* warp_count = reinterpret_cast<int*>(smem + kCountOff);
  int* warp_max = reinterpret_cast<int*>(smem + kMaxIdOff);
  int* sel_s = reinterpret_cast<int*>(smem + kSelOff);
  auto ready_bar = [&](int b) { return base + kBarOff + 8u * b; };
  auto free_bar = [&](int b) { return base + kBarOff + 8u * (2 + b); };
  const std::uint32_t q_full_bar = base + kBarOff + 8u * 4;
  const std::uint32_t q_empty_bar = q_full_bar + 8u;

  const int H = d.heads, K = d.topk;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) {
    for (int b = 0; b < 2; ++b) {
      mbar_init(ready_bar(b), kProducerThreads);  // one cp.async arrival per producer thread
      mbar_init(free_bar(b), 4);                  // one arrival per warp of the consumer
    }
    mbar_init(q_full_bar, kProducerThreads + 1);  // cp.async arrivals + the key count's
    mbar_init(q_empty_bar, kConsumerThreads / 32);
    mbar_init_fence();
  }
  __syncthreads();

  if (warp < kProducerThreads / 32) {
    // ---------------- producer: candidates, Q, key tiles ----------------
    int ring = 0;  // tiles issued so far: tile `ring` goes to buffer ring % 2
    int local = 0;
    for (int item = blockIdx.x; item < items; item += gridDim.x, ++local) {
      const int t = item / head_blocks, h0 = (item % head_blocks) * kRows;
      // The next item's Q rows and top-k row into L2 while this one runs (its compaction and
      // Q load then wait on L2, not device memory).
      if (item + static_cast<int>(gridDim.x) < items)
        prefetch_item_l2<kProducerThreads>(q, topk, K, (item + gridDim.x) / head_blocks, H,
                                           ((item + gridDim.x) % head_blocks) * kRows, tid);
      const int b = meta.row_segment[t], pos = meta.row_position[t];
      const int comp0 = meta.comp_start[b];
      const int vis = meta.row_is_padding[t] ? 0 : min((pos + 1) / d.ratio, meta.comp_start[b + 1] - comp0);
      int n = compact_valid_ids<kProducerThreads>(topk + static_cast<long>(t) * K, K, sel_s, warp_count,
                                                  [] { named_barrier_sync(kProducerBar, kProducerThreads); });
      // Served only if every valid id is visible (else the loss's denominator is not the
      // forward's LSE and the loss kernel computes this row's teacher itself).
      int mx = -1;
      for (int j = tid; j < n; j += kProducerThreads) mx = max(mx, sel_s[j]);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      if (lane == 0) warp_max[warp] = mx;
      named_barrier_sync(kProducerBar, kProducerThreads);
      mx = max(max(warp_max[0], warp_max[1]), max(warp_max[2], warp_max[3]));
      if (mx >= vis) n = 0;
      const int tiles = (n + kKeys - 1) / kKeys;

      // Q once the consumers' last S of the previous item has read it (issued after this
      // item's first tile, so that gather overlaps the wait); rows past H zero.
      auto load_q = [&]() {
        mbar_wait(q_empty_bar, (local & 1) ^ 1);
        if (n > 0) load_q_tile<kProducerThreads>(base + kQOff, q, t, H, h0, tid);
        cp_async_mbar_arrive(q_full_bar);
        if (tid == 0) {
          item_keys[local & 1] = n;
          mbar_arrive(q_full_bar);  // release: the key count is visible with the phase
        }
      };
      if (tiles == 0) load_q();
      const bf16* comp_base = comp + static_cast<long>(comp0) * kDim;
      // Past the candidates: a real row of the segment (finite), masked by the consumers.
      auto key_row = [&](int slot) { return comp_base + static_cast<long>(slot < n ? sel_s[slot] : sel_s[0]) * kDim; };
      for (int tile = 0; tile < tiles; ++tile, ++ring) {
        const int buf = ring & 1;
        const int row = warp * 16 + (lane & 15);
        const bf16* mine = key_row(tile * kKeys + row);
        if (tile + 1 < tiles) {  // the next tile's rows into L2 (lane l: half l / 16 of its row)
          const char* nx = reinterpret_cast<const char*>(key_row((tile + 1) * kKeys + row));
#pragma unroll
          for (int i = 0; i < 4; ++i) prefetch_l2(nx + (lane >> 4) * 512 + i * 128);
        }
        mbar_wait(free_bar(buf), ((ring >> 1) & 1) ^ 1);
        const std::uint32_t dst = base + kKOff + buf * kTileBytes;
        // Row 16 w + j of the tile: 32 lanes x 16 bytes per half, both halves.
#pragma unroll 4
        for (int j = 0; j < 16; ++j) {
          const bf16* src = reinterpret_cast<const bf16*>(
              __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(mine), j));
          cp_async_16(dst + tile_off(warp * 16 + j, lane), src + lane * 8);
          cp_async_16(dst + tile_off(warp * 16 + j, 32 + lane), src + (32 + lane) * 8);
        }
        cp_async_mbar_arrive(ready_bar(buf));
        if (tile == 0) load_q();
      }
      // sel_s and warp_max are rewritten by the next item only after every producer lane
      // resolved this item's rows.
      named_barrier_sync(kProducerBar, kProducerThreads);
    }
    cp_async_wait_all();
    return;
  }

  // ---------------- consumers ----------------
  const int c = warp / 4 - 1;  // this consumer takes the tiles of buffer c
  const int w = warp & 3, g = lane >> 2, qd = lane & 3;
  const int row0 = 16 * w + g, row1 = row0 + 8;
  const float scale2 = d.scale * kLog2e;
  const std::uint32_t q_base = base + kQOff, k_base = base + kKOff + c * kTileBytes;
  int ring = 0;   // tiles of the whole run so far (both buffers)
  int mine = 0;   // this consumer's tiles so far (its buffer's phases)
  int local = 0;
  for (int item = blockIdx.x; item < items; item += gridDim.x, ++local) {
    const int t = item / head_blocks, h0 = (item % head_blocks) * kRows;
    mbar_wait(q_full_bar, local & 1);
    fence_proxy_async_smem();  // the producer's cp.async writes of Q -> wgmma
    const int n = item_keys[local & 1];
    const int tiles = (n + kKeys - 1) / kKeys;
    // This item's tiles of buffer c: item tile i is run tile ring + i.
    const int first = ((ring & 1) == c) ? 0 : 1;
    const int count = tiles > first ? (tiles - first + 1) / 2 : 0;
    if (count == 0 && lane == 0) mbar_arrive(q_empty_bar);  // no S of this consumer reads Q
    const bool real0 = h0 + row0 < H, real1 = h0 + row1 < H;
    const float l0 = real0 && n > 0 ? lse[static_cast<long>(t) * H + h0 + row0] * kLog2e : 0.0f;
    const float l1 = real1 && n > 0 ? lse[static_cast<long>(t) * H + h0 + row1] * kLog2e : 0.0f;
    float* dst = kept + static_cast<long>(t) * d.topk * 2;
    for (int k = 0; k < count; ++k, ++mine) {
      const int tile = first + 2 * k;
      float s[32];
      mbar_wait(ready_bar(c), mine & 1);
      fence_proxy_async_smem();
      wgmma_fence();
      qk_half(s, q_base, k_base, 0, true);
      qk_half(s, q_base, k_base, 1, false);
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_pin(s);
      if (lane == 0) {
        mbar_arrive(free_bar(c));
        if (k == count - 1) mbar_arrive(q_empty_bar);  // this consumer's last S of the item
      }
      // P, then each column's sum over this warp's 16 rows: the thread's two rows, then the
      // eight lanes g of the same qd.
      float col[16];
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int key = tile * kKeys + 8 * i + 2 * qd + j;
          const float p0 = real0 && key < n ? exp2_ftz(fmaf(s[4 * i + j], scale2, -l0)) : 0.0f;
          const float p1 = real1 && key < n ? exp2_ftz(fmaf(s[4 * i + 2 + j], scale2, -l1)) : 0.0f;
          float v = p0 + p1;
          v += __shfl_xor_sync(0xffffffffu, v, 4);
          v += __shfl_xor_sync(0xffffffffu, v, 8);
          v += __shfl_xor_sync(0xffffffffu, v, 16);
          col[2 * i + j] = v;
        }
      float* pt = part + ((c * 2 + (mine & 1)) * 4) * kKeys;  // [4 warps][64], by tile parity
      if (g == 0)
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          pt[w * kKeys + 8 * i + 2 * qd] = col[2 * i];
          pt[w * kKeys + 8 * i + 2 * qd + 1] = col[2 * i + 1];
        }
      // (Double-buffered by tile parity: this tile's partials are read before any thread of
      // the consumer passes the next tile's barrier, so one barrier a tile suffices.)
      named_barrier_sync(kConsumerBar0 + c, kConsumerThreads / 2);
      const int lt = tid - kProducerThreads - c * (kConsumerThreads / 2);  // 0..127
      if (lt < kKeys) {
        const int key = tile * kKeys + lt;
        if (key < n) {
          const float m = ((pt[lt] + pt[kKeys + lt]) + pt[2 * kKeys + lt]) + pt[3 * kKeys + lt];
          if (head_blocks == 1) dst[2 * key] = m;
          else atomicAdd(dst + 2 * key, m);
        }
      }
    }
    ring += tiles;
  }
}

}  // namespace

bool indexer_teacher_wgmma_supported(const LayerDims& d) {
  // At most two head blocks: two partial masses added onto zeros give the same float in
  // either order, three would not.
  return d.head_dim == kDim && d.ratio == 4 && d.topk > 0 && d.heads <= 2 * kRows &&
         teacher_smem_bytes(d) <= dynamic_smem_limit(indexer_teacher_wgmma_kernel);
}

void launch_indexer_teacher_wgmma(const LayerDims& d, const DeviceMetadata& meta,
                                  const IndexerLossArgs& a, float* kept, cudaStream_t stream,
                                  bool logits_kept) {
  if (d.rows <= 0) return;
  require(d.head_dim == kDim && d.ratio == 4 && d.heads <= 2 * kRows, ErrorKind::Unsupported,
          "the wgmma indexer-loss teacher needs head_dim 512, the CSA ratio 4 and at most 128 heads");
  require(a.sparse && a.lse != nullptr && kept != nullptr, ErrorKind::InvalidArgument,
          "the wgmma indexer-loss teacher serves the sparse loss with the forward's LSE, into `kept`");
  const std::size_t smem = teacher_smem_bytes(d);
  allow_dynamic_smem(indexer_teacher_wgmma_kernel, smem,
                     "the wgmma indexer-loss teacher (its shared memory grows with index_topk)");
  const int head_blocks = (d.heads + kRows - 1) / kRows;
  if (head_blocks > 1) {  // the head blocks' partial masses add onto zeros
    const std::size_t entries = static_cast<std::size_t>(d.rows) * d.topk;
    if (logits_kept)  // the masses only (every other float): the logits are the indexer's
      CSATTN_CUDA_CHECK(cudaMemset2DAsync(kept, 2 * sizeof(float), 0, sizeof(float), entries, stream));
    else
      CSATTN_CUDA_CHECK(cudaMemsetAsync(kept, 0, sizeof(float) * 2 * entries, stream));
  }
  const long items = static_cast<long>(d.rows) * head_blocks;
  require(items < (1l << 31), ErrorKind::Unsupported, "too many indexer-loss rows for one launch");
  const int grid = static_cast<int>(std::min<long>(items, multiprocessor_count()));
  indexer_teacher_wgmma_kernel<<<grid, kThreads, smem, stream>>>(d, meta, a.q, a.comp, a.topk, a.lse, kept,
                                                                 head_blocks, static_cast<int>(items));
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
