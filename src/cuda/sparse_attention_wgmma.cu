// Warp-specialised wgmma sparse attention for head_dim 512 (Hopper, sm_90a); the contract of
// launch_sparse_attention (kernels.hpp), checked against sparse_attention_mma.cu.
//
// Work item = (query token, block of 64 heads): the heads of a token share one K=V head, so
// each gathered 64-key tile serves all 64 head rows. Persistent grid (one CTA per SM walks the
// items with stride gridDim.x). The item's key tiles are taken in pairs (2p, 2p + 1); tile 2p
// goes to key buffer 0 and consumer 0, tile 2p + 1 to buffer 1 and consumer 1 (an odd last
// tile is paired with a fully masked one). Three warpgroups:
//   WG0, producer (72 registers): builds each item's key list (CSA: compacts the top-k row),
//     gathers the pair's tiles with 16-byte cp.async (each thread its own 4 rows of a tile, one
//     16-byte chunk of each 128-byte line) by halves of the dims (buffer 0 dims
//     0-255, buffer 0 dims 256-511, buffer 1 dims 256-511, buffer 1 dims 0-255: the order the
//     consumers free them), each half signalled on its own `ready` mbarrier and refilled after
//     its own `free` mbarrier; loads the item's Q once both consumers' last S of the previous
//     item has read Q (q_empty), so a CTA's set-up overlaps the previous item's tail.
//   WG1, WG2, consumers c = 0, 1 (208 registers): consumer c computes S_c = Q K_c^T for its own
//     tile over all 512 dims (32 x wgmma m64n64k16: as many shared-memory bytes per tensor
//     cycle as the pipe delivers, where a 32-key S would need 1.5x) and owns output dims
//     [256c, 256c + 256) (O: 64 x 256 fp32 = 128 registers). Per pair:
//       c0: softmax of S_0 against the running max -> m_0, publishes m_0 and P_0 (bf16, shared
//           memory; named barrier M0P0), O += P_0 V_0[:, 0:256] with P_0 from registers,
//           frees buffer 0's first half;
//       c1: O to m_0, O += P_0 V_0[:, 256:512] in flight while it takes the softmax of S_1
//           against m_0 -> m_1 and publishes m_1 and P_1 (M1P1); frees buffer 0's second half
//           once that product is done, moves O to m_1, O += P_1 V_1[:, 256:512] from registers,
//           frees buffer 1's second half;
//       c0: moves O to m_1, O += P_1 V_1[:, 0:256]; (next pair, once its next S is issued)
//           frees buffer 1's first half.
//     So one consumer's softmax runs while the other's MMAs keep the tensor pipe busy, buffer 0
//     is done with by mid-pair (its refill overlaps the pair's P_1 V_1), and both end every
//     pair on the same max m_1 (the next pair's running max). P_0 is published once, at m_0:
//     consumer 1 rescales its O instead (one more O rescale a consumer and pair, skipped when
//     no row of the warp moved its max, the common case after a row's first tiles).
// Shared memory (1024-byte aligned, every operand in 128-byte-swizzle atoms, see wgmma.cuh):
//   Q [64 x 512] 64 KB | key buffers 0, 1 [64 x 512] 128 KB | P_0, P_1 [64 x 64] 16 KB |
//   barriers, published maxima, row sums, key counts | CSA: the compacted top-k ids.
// A [R x 512] tile (R = 64 rows) is 8 column blocks of [R x 64 dims] (R x 128 bytes), row r at
// r * 128, 16-byte chunk c at c ^ (r % 8), so dims 0-255 are the tile's first 32 KB. K-major
// operands (Q, keys for S, P) step 8 rows by SBO = 1024; the MN-major V operand steps 8 keys by
// SBO = 1024 and 64 dims by LBO = 8 KB.
//
// Pair instance (kPair; an even head-block count, e.g. H = 128, where a cluster of two fits):
// the two CTAs of a cluster take a token's head blocks 2j, 2j + 1 and share every key tile: each
// producer brings rows 32 rank .. 32 rank + 31 of each half tile by TMA tensor copies of one
// 128-byte box (a row's 64-dim block), multicast into both CTAs' buffers, so each row is read
// from L2 once per token instead of once per head block; a buffer is refilled once both CTAs'
// consumers have freed it (free barriers count both; waits at cluster scope). Candidate: the
// forwarding variants lost 27-41% to the land-then-forward chain (perf.md, twenty-ninth
// session); multicast has no such chain.
//
// Softmax: log2 domain, the sink as the initial running max (a zero-value logit, its exp
// counted once per row), slots past the key list -inf, LSE natural-log with the sink. Key order
// is the mma kernel's (window, then compressed: HCA all visible, CSA the valid top-k ids in the
// order given). Head rows past H are zero and never written. The published maxima and the fixed
// order of every reduction make runs bitwise repeatable.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/attention_keys.cuh"
#include "cuda/check.hpp"
#include "cuda/cluster_sync.cuh"
#include "cuda/kernels.hpp"
#include "cuda/mma_util.cuh"
#include "cuda/phase_stamp.cuh"
#include "cuda/tma.hpp"
#include "cuda/wgmma.cuh"
#include "cuda/wgmma_sync.cuh"
#include "cuda/wgmma_tile.cuh"

namespace csattn::cuda {

namespace {

constexpr int kDim = 512;
constexpr int kRows = 64;   // head rows per CTA (one wgmma M)
constexpr int kKeys = 64;   // keys per tile
constexpr int kProducerThreads = 128;
constexpr int kConsumerThreads = 256;
constexpr int kThreads = kProducerThreads + kConsumerThreads;
constexpr int kProducerRegs = 72;
constexpr int kConsumerRegs = 208;
// setmaxnreg only moves registers inside the CTA's launch allocation: __launch_bounds__(kThreads,
// 1) caps a thread at 65536 / kThreads rounded down to a multiple of 8 (168; ptxas uses all of
// them, `kernel_checks` prints REG), so the consumers' increase must be covered by the
// producer's decrease: 128 x 72 + 256 x 208 = 62464 <= 384 x 168. (At 56 / 224, the limit
// exactly, ptxas spilled the producer's per-item values once consumer 1 kept P_1 across its
// P_0 product; the consumers need no more than 208.)
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
static_assert(kProducerThreads * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * kLaunchRegs,
              "setmaxnreg budget exceeds the launch allocation");
constexpr int kBlockBytes = kSwizzleBlockBytes;       // one [64 rows x 64 dims] column block
constexpr int kTileBytes = (kDim / 64) * kBlockBytes;  // [64 x 512] bf16 = 64 KB
constexpr int kQOff = 0;
constexpr int kKOff = kQOff + kTileBytes;
constexpr int kPOff = kKOff + 2 * kTileBytes;           // P_0, P_1 [64 x 64] bf16
constexpr int kBarOff = kPOff + 2 * kBlockBytes;        // ready[2][2], free[2][2], q_full, q_empty
constexpr int kMaxOff = kBarOff + 10 * 8;               // published row maxima [2][64]
constexpr int kSumOff = kMaxOff + 2 * kRows * 4;        // row sums [2 items][2 consumers][64]
constexpr int kCountOff = kSumOff + 4 * kRows * 4;      // producer warp counts [4]
constexpr int kItemOff = kCountOff + (kProducerThreads / 32) * 4;  // key counts [2]
constexpr int kSelOff = kItemOff + 2 * 4;               // CSA ids [topk]
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Named barriers (0 is __syncthreads): the consumers' hand-overs, each arrived at by one
// consumer (128 threads) and waited on by the other.
constexpr int kBarM0P0 = 1;     // c0 -> c1: m_0 and P_0 published
constexpr int kBarM1P1 = 2;     // c1 -> c0: m_1 and P_1 published
constexpr int kBarSums = 3;     // both: the row sums of an item
constexpr int kProducerBar = 4;

std::size_t wgmma_smem_bytes(const LayerDims& d) {
  // + 1 KB: the dynamic base is aligned up to 1024 bytes in the kernel.
  return 1024 + kSelOff + (d.ratio == 4 ? sizeof(int) * static_cast<std::size_t>(d.topk) : 0);
}

// Masks slots at or past n (keys `key0 + column`) with -inf and returns each row's maximum in
// the log2 domain. S itself stays unscaled: exponentiate folds the scale into one FFMA. The
// scale is positive, so the scaled maximum, rounded once, is the maximum of the scaled and
// rounded values - the same running maxima as scaling every element first.
__device__ __forceinline__ void mask_and_max(float (&s)[32], int key0, int n, float scale2,
                                             int qd, float (&mx)[2]) {
  mx[0] = mx[1] = -INFINITY;
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int key = key0 + 8 * i + 2 * qd + (j & 1);
      const float v = key < n ? s[4 * i + j] : -INFINITY;
      s[4 * i + j] = v;
      mx[j >> 1] = fmaxf(mx[j >> 1], v);
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    mx[r] *= scale2;
  }
}

// P = exp2(S * scale2 - m) in place (fp32; masked slots -inf -> 0, m is finite: the running
// maximum starts at the sink), its row partial sums added to l, and its bf16 A fragments.
__device__ __forceinline__ void exponentiate(float (&s)[32], float scale2, const float (&m)[2],
                                             float (&l)[2], std::uint32_t (&p)[16]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    s[i] = exp2_ftz(fmaf(s[i], scale2, -m[(i >> 1) & 1]));
    l[(i >> 1) & 1] += s[i];
  }
#pragma unroll
  for (int j = 0; j < 16; ++j) p[j] = pack_bf16(s[2 * j], s[2 * j + 1]);
}

// O times f per row; skipped when no row of the warp moved (f = 1 exactly: the running max
// did not rise), which after a row's first tiles is the common case.
__device__ __forceinline__ void rescale_if_moved(float (&o)[128], const float (&f)[2]) {
  if (!__any_sync(0xffffffffu, f[0] != 1.0f || f[1] != 1.0f)) return;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    o[4 * i] *= f[0];
    o[4 * i + 1] *= f[0];
    o[4 * i + 2] *= f[1];
    o[4 * i + 3] *= f[1];
  }
}

// O and the row sums l times f per row (O as above).
__device__ __forceinline__ void rescale_if_moved(float (&o)[128], float (&l)[2], const float (&f)[2]) {
  l[0] *= f[0];
  l[1] *= f[1];
  rescale_if_moved(o, f);
}

// Publishes a consumer's P tile (bf16 fragments) and its rows' maxima `m` for the other
// consumer: the st.shared made visible to the other's wgmma (the caller then arrives at the
// hand-over barrier).
__device__ __forceinline__ void publish_p(unsigned char* tile, const std::uint32_t (&p)[16], float* maxima,
                                          const float (&m)[2], int row0, int qd) {
  store_fragment(tile, p, row0, qd);
  if (qd == 0) {
    maxima[row0] = m[0];
    maxima[row0 + 8] = m[1];
  }
  fence_proxy_async_smem();  // st.shared -> the other consumer's wgmma
}

// Persistent: CTA i handles work items i, i + gridDim.x, ... (item = token * head_blocks +
// head block). The producer runs ahead across items: it builds the next item's key list and
// streams its tiles while the consumers finish the current item. `stamps` (measurement only,
// null otherwise): clock() at the phase boundaries, laid out as AttentionForwardStamps
// (kernels.hpp) says.
//
// One instance serves both: the stamps are a run-time branch, not a template parameter. The
// branch makes each phase point a basic-block boundary, and ptxas schedules the pair loop
// better with those boundaries than without: a compile-time-plain instance of this kernel ran
// 4-9% slower than the stamped one on an H100 (perf.md, twenty-first session), while the
// untaken branch costs one uniform predicate test per phase point.
template <bool kPair>
__global__ void __launch_bounds__(kThreads, 1)
    sparse_attention_wgmma_kernel(LayerDims d, DeviceMetadata meta, const bf16* q,
                                  const bf16* kv, const bf16* comp,
                                  const __grid_constant__ CUtensorMap kv_map,
                                  const __grid_constant__ CUtensorMap comp_map, const float* sink,
                                  const std::int32_t* topk, bf16* out, float* lse,
                                  int head_blocks, int items, unsigned* stamps) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + align_1024_pad(smem_raw);  // wgmma's swizzle atoms
  const std::uint32_t base = smem_addr(smem);
  float* row_max = reinterpret_cast<float*>(smem + kMaxOff);
  float* row_sum = reinterpret_cast<float*>(smem + kSumOff);
  int* warp_count = reinterpret_cast<int*>(smem + kCountOff);
  int* item_keys = reinterpret_cast<int*>(smem + kItemOff);  // key count per item, [2]
  int* sel_s = reinterpret_cast<int*>(smem + kSelOff);
  // ready / free of (buffer b, half h): b = tile parity, h = dims 0-255 / 256-511.
  auto ready_bar = [&](int b, int h) { return base + kBarOff + 8u * (2 * b + h); };
  auto free_bar = [&](int b, int h) { return base + kBarOff + 8u * (4 + 2 * b + h); };
  const std::uint32_t q_full_bar = base + kBarOff + 8u * 8;
  const std::uint32_t q_empty_bar = q_full_bar + 8u;
  // kPair: the CTAs of a cluster of two are a token's head blocks 2j and 2j + 1 (items 2j', 2j'
  // + 1 with an even head-block count); each brings half of every key tile's rows into both
  // CTAs' buffers by TMA multicast (kv_map, comp_map: [rows x 512] in 128-byte boxes).
  const std::uint32_t rank = kPair ? cluster_ctarank() : 0u, peer = rank ^ 1u;

  const int H = d.heads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  using Stamps = AttentionForwardStamps;
  // Warpgroup `warp / 4` (0 producer, 1 and 2 the consumers) stamps phase p of row `row` of
  // its local item `local` (only item Stamps::item is kept).
  auto stamp_at = [&](int local, int row, int phase) {
    if (stamps != nullptr && local == Stamps::item)
      write_phase_stamp<Stamps::ctas, 3, Stamps::pairs + 1, Stamps::phases>(stamps, row, phase);
  };
  auto stamp = [&](int local, int pair, int phase) {  // key-tile pair `pair`
    if (pair < Stamps::pairs) stamp_at(local, pair, phase);
  };
  auto stamp_item = [&](int local, int phase) { stamp_at(local, Stamps::pairs, phase); };
  // The pair instance launched without its cluster of two would map its peer's shared memory
  // to nothing: stop at once rather than corrupt.
  if (kPair && cluster_nctarank() != 2u) __trap();
  if (tid == 0) {
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 2; ++h) {
        // One cp.async arrival per producer thread; kPair: one arrival (the producer's thread 0,
        // expecting the half's 32 KB as complete_tx bytes: 16 KB from each CTA's multicasts).
        mbar_init(ready_bar(b, h), kPair ? 1 : kProducerThreads);
        // One arrival per warp of the freeing consumer; kPair: the peer's consumer's too (this
        // CTA's producer multicasts into the peer's buffer as well).
        mbar_init(free_bar(b, h), kPair ? 8 : 4);
      }
    mbar_init(q_full_bar, kProducerThreads + 1);  // cp.async arrivals + the key count's
    mbar_init(q_empty_bar, kConsumerThreads / 32);
    mbar_init_fence();
  }
  if constexpr (kPair)
    cluster_sync_all();  // both CTAs' barriers initialised before either touches the other's
  else
    __syncthreads();

  if (warp < kProducerThreads / 32) {
    // ---------------- producer: key lists, Q, key tiles ----------------
    setmaxnreg_dec<kProducerRegs>();
    const bool csa = d.ratio == 4;
    const int og = tid >> 3, oc = tid & 7;  // key gather: row group, 16-byte chunk
    const std::uint32_t own_dst = base + kKOff + og * 128 + ((oc ^ (og & 7)) << 4);
    // Q is loaded (read once) under evict_first, and O stored so: the Q and O streams (0.5-1 GB
    // a launch) would otherwise take L2 from the key rows every item gathers again (perf.md,
    // twenty-sixth session: +1-4%, most at Flash 64K keys).
    const std::uint64_t stream_policy = l2_evict_first_policy();
    int ring = 0;  // pairs issued so far (barrier phases)
    int local = 0;
    for (int item = blockIdx.x; item < items; item += gridDim.x, ++local) {
      stamp_item(local, 0);
      const int t = item / head_blocks, h0 = (item % head_blocks) * kRows;
      // The next item's Q rows (64 KB, contiguous) and top-k row into L2 while this one runs,
      // at normal priority (its set-up then waits on L2, not device memory; prefetched under
      // evict_first by one bulk prefetch, Q lost 0.5-1% at Pro, perf.md twenty-sixth session).
      const int following = item + gridDim.x;
      if (following < items) {
        const int nt = following / head_blocks, nh = (following % head_blocks) * kRows;
        prefetch_item_l2<kProducerThreads>(q, csa ? topk : nullptr, d.topk, nt, H, nh, tid);
      }
      // The key list (same order as build_key_list): window rows, then compressed rows.
      const int b = meta.row_segment[t], pos = meta.row_position[t];
      const QueryWindow win = query_window(d, meta, b, pos);
      const int n_win = win.n;
      const int comp0 = meta.comp_start[b];
      int n_comp;
      if (csa)
        n_comp = compact_valid_ids<kProducerThreads>(
            topk + static_cast<long>(t) * d.topk, d.topk, sel_s, warp_count,
            [] { named_barrier_sync(kProducerBar, kProducerThreads); });
      else
        n_comp = d.ratio > 1 ? min((pos + 1) / d.ratio, meta.comp_start[b + 1] - comp0) : 0;
      const int n = n_win + n_comp;
      const int pairs = (n + 2 * kKeys - 1) / (2 * kKeys);
      stamp_item(local, 1);
      const bf16* win_base = kv + static_cast<long>(win.row0) * kDim;
      const bf16* comp_base = comp + static_cast<long>(comp0) * kDim;

      // Q of this item once the consumers' S no longer reads the previous one (issued after
      // this item's first half tile, so that gather overlaps the wait); rows past H are
      // zero-filled by the copy itself (source size 0).
      auto load_q = [&]() {
        mbar_wait(q_empty_bar, (local & 1) ^ 1);
        load_q_tile<kProducerThreads>(base + kQOff, q, t, H, h0, tid, stream_policy);
        cp_async_mbar_arrive(q_full_bar);
        if (tid == 0) {
          item_keys[local & 1] = n;
          mbar_arrive(q_full_bar);  // release: the key count is visible with the phase
        }
      };
      if (pairs == 0) load_q();
      auto key_row = [&](int slot) -> const bf16* {
        if (slot >= n) slot = 0;  // past the list: a real row (finite), masked by the consumers
        if (slot < n_win) return win_base + static_cast<long>(slot) * kDim;
        const int j = slot - n_win;
        return comp_base + static_cast<long>(csa ? sel_s[j] : j) * kDim;
      };
      // Thread (og, oc) copies the 16-byte chunk oc of every 64-dim block of its rows og,
      // og + 16, og + 32, og + 48, from pointers it resolved once a pair: a warp instruction is
      // 4 rows x 128 contiguous bytes and needs no shuffle (a warp a row, each copy shuffling
      // the row's pointer to the warp, kept the producer issuing ~75% of its time on the H200
      // and ran 0-6% slower on the H100, perf.md twenty-fifth session). Those rows share
      // row % 8, so the swizzled destination is one per-thread base plus constants.
      auto gather_half = [&](const bf16* const (&rows)[4], int buf, int h) {
        const std::uint32_t dst = own_dst + buf * kTileBytes;
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int blk = 4 * h; blk < 4 * h + 4; ++blk)
            cp_async_16(dst + blk * kBlockBytes + i * 16 * 128, rows[i] + blk * 64);
        cp_async_mbar_arrive(ready_bar(buf, h));
      };
      // kPair: a key row as (map, row): the window rows in kv_map, the compressed ones in
      // comp_map (past the list: row 0 of the window, finite and masked, as key_row).
      struct RowRef {
        const CUtensorMap* map;
        int row;
      };
      auto key_ref = [&](int slot) -> RowRef {
        if (slot >= n) slot = 0;
        if (slot < n_win) return {&kv_map, win.row0 + slot};
        const int j = slot - n_win;
        return {&comp_map, comp0 + (csa ? sel_s[j] : j)};
      };
      // kPair: thread (r, c) = (tid / 4, tid % 4) brings column block 4 h + c of row 32 rank + r
      // of the tile (one 128-byte box) into both CTAs' buffer `buf` at its swizzled line (the
      // TMA swizzles by the shared address: row r's 16-byte chunk j at j ^ (r % 8), the layout
      // the cp.async gather writes), counted on both CTAs' ready(buf, h); thread 0 first
      // announces the half's 32 KB on this CTA's ready (the peer's 16 KB may land before it).
      auto multicast_half = [&](RowRef ref, int buf, int h) {
        if (tid == 0) mbar_arrive_expect_tx(ready_bar(buf, h), kRows * 256 * 2);
        const int blk = 4 * h + (tid & 3);
        const int row = 32 * static_cast<int>(rank) + (tid >> 2);
        tma_load_2d_multicast(base + kKOff + buf * kTileBytes + blk * kBlockBytes + row * 128, ref.map, blk * 64,
                              ref.row, ready_bar(buf, h), 0x3);
      };
      // A free barrier that the peer's consumer arrives on too (kPair) is acquired at cluster
      // scope.
      auto wait_free = [&](int b, int h, std::uint32_t parity) {
        if constexpr (kPair)
          mbar_wait_cluster(free_bar(b, h), parity);
        else
          mbar_wait(free_bar(b, h), parity);
      };
      for (int pair = 0; pair < pairs; ++pair, ++ring) {
        stamp(local, pair, 0);
        const std::uint32_t phase = (ring & 1) ^ 1;
        const bf16* own[2][4];  // this thread's rows of each tile, at its chunk (plain)
        RowRef box_row[2];      // kPair: this thread's box row of each tile
        if constexpr (kPair) {
#pragma unroll
          for (int tile = 0; tile < 2; ++tile)
            box_row[tile] = key_ref((2 * pair + tile) * kKeys + 32 * static_cast<int>(rank) + (tid >> 2));
        } else {
#pragma unroll
          for (int tile = 0; tile < 2; ++tile)
#pragma unroll
            for (int i = 0; i < 4; ++i) own[tile][i] = key_row((2 * pair + tile) * kKeys + og + 16 * i) + oc * 8;
        }
        auto fill = [&](int tile, int h) {
          if constexpr (kPair)
            multicast_half(box_row[tile], tile, h);
          else
            gather_half(own[tile], tile, h);
        };
        // The next pair's rows into L2 now, one pair ahead of their gathers: at 32K+ keys the
        // random rows are mostly not in L2, and the gather of a freed half is on the critical
        // path. Thread (og, oc) takes the line oc of its 4 rows in both tiles.
        if (pair + 1 < pairs) {
#pragma unroll
          for (int tile = 2; tile < 4; ++tile)
#pragma unroll
            for (int i = 0; i < 4; ++i)
              if (!kPair || (i >> 1) == static_cast<int>(rank))
                prefetch_l2(key_row((2 * pair + tile) * kKeys + og + 16 * i) + oc * 64);
        }
        wait_free(0, 0, phase);
        stamp(local, pair, 1);
        fill(0, 0);
        if (pair == 0) load_q();
        wait_free(0, 1, phase);
        stamp(local, pair, 2);
        fill(0, 1);
        wait_free(1, 1, phase);
        stamp(local, pair, 3);
        fill(1, 1);
        wait_free(1, 0, phase);
        stamp(local, pair, 4);
        fill(1, 0);
        stamp(local, pair, 5);
      }
      stamp_item(local, 2);
      // sel_s is rewritten by the next item's compaction only after every lane of the
      // warpgroup resolved its rows of this item.
      named_barrier_sync(kProducerBar, kProducerThreads);
      stamp_item(local, 3);
    }
    cp_async_wait_all();
    if constexpr (kPair) cluster_sync_all();  // the peer may still arrive on or multicast into ours
    return;
  }

  // ---------------- consumers ----------------
  setmaxnreg_inc<kConsumerRegs>();
  const int c = warp / 4 - 1;  // consumer: tiles of parity c, output dims [256c, 256c + 256)
  const int g = lane >> 2, qd = lane & 3;
  const int row0 = 16 * (warp & 3) + g, row1 = row0 + 8;
  const float scale2 = d.scale * kLog2e;
  const std::uint64_t stream_policy = l2_evict_first_policy();  // O is written once
  const std::uint32_t q_base = base + kQOff;
  const std::uint32_t k0_base = base + kKOff, k1_base = k0_base + kTileBytes;
  const std::uint32_t p0_base = base + kPOff, p1_base = p0_base + kBlockBytes;
  unsigned char* p0_s = smem + kPOff;
  unsigned char* p1_s = p0_s + kBlockBytes;
  // This consumer is done reading (b, h): one arrival a warp on the free barrier, kPair also on
  // the peer's (whose producer multicasts its rows into this CTA's buffer).
  // kPair: half of each (b, h) arrives by the peer's multicast, whose complete_tx releases at
  // cluster scope: the wait acquires at cluster scope to pair with it.
  auto wait_ready = [&](std::uint32_t bar, std::uint32_t parity) {
    if constexpr (kPair)
      mbar_wait_cluster(bar, parity);
    else
      mbar_wait(bar, parity);
  };
  auto release = [&](int b, int h) {
    if (lane != 0) return;
    mbar_arrive(free_bar(b, h));
    if constexpr (kPair) mbar_arrive_cluster(mapa_shared(free_bar(b, h), peer));
  };
  int ring = 0;
  int local = 0;
  for (int item = blockIdx.x; item < items; item += gridDim.x, ++local) {
    stamp_item(local, 0);
    const int t = item / head_blocks, h0 = (item % head_blocks) * kRows;
    mbar_wait(q_full_bar, local & 1);
    stamp_item(local, 1);
    fence_proxy_async_smem();  // the producer's cp.async writes of Q -> wgmma
    const int n = item_keys[local & 1];
    const int pairs = (n + 2 * kKeys - 1) / (2 * kKeys);
    if (pairs == 0 && lane == 0) mbar_arrive(q_empty_bar);  // no S reads this Q

    float m_run[2] = {(h0 + row0 < H ? sink[h0 + row0] : 0.0f) * kLog2e,
                      (h0 + row1 < H ? sink[h0 + row1] : 0.0f) * kLog2e};
    // The sink's exp(sigma - m) = 1 with m = sigma, counted by one thread of the row.
    float l_part[2] = {c == 0 && qd == 0 ? 1.0f : 0.0f, c == 0 && qd == 0 ? 1.0f : 0.0f};
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    float s[32];
    std::uint32_t p[16];

    if (c == 0) {
      // S_0 over both halves of buffer 0 (the producer refills the first half first); the
      // first pair's here, every later one's at the end of the previous pair, overlapping
      // that pair's last O += P_1 V_1.
      // `pending`: the previous pair's O += P_1 V_1[:, 0:256] is in flight; it is waited for
      // right after the first half's S is issued, so buffer 1's first half is freed before
      // this S waits for buffer 0's second half.
      // `pair`: the pair whose stamps 5 and 6 take the two ready waits (none before the loop).
      auto issue_s0 = [&](std::uint32_t phase, bool pending, int pair) {
        wait_ready(ready_bar(0, 0), phase);
        if (pair >= 0) stamp(local, pair, 5);
        fence_proxy_async_smem();
        wgmma_fence();
        qk_half(s, q_base, k0_base, 0, true);
        wgmma_commit();
        if (pending) {
          wgmma_wait<1>();
          wgmma_pin(o);
          release(1, 0);
        }
        wait_ready(ready_bar(0, 1), phase);
        if (pair >= 0) stamp(local, pair, 6);
        fence_proxy_async_smem();
        wgmma_fence();
        qk_half(s, q_base, k0_base, 1, false);
        wgmma_commit();
      };
      if (pairs > 0) {
        issue_s0(ring & 1, false, -1);
        wgmma_wait<0>();
        wgmma_pin(s);
      }
      for (int pair = 0; pair < pairs; ++pair, ++ring) {
        stamp(local, pair, 0);
        if (pair == pairs - 1 && lane == 0) mbar_arrive(q_empty_bar);  // last S of the item
        float mx[2];
        mask_and_max(s, 2 * pair * kKeys, n, scale2, qd, mx);
        float m0[2], f[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          m0[r] = fmaxf(m_run[r], mx[r]);
          f[r] = exp2_ftz(m_run[r] - m0[r]);
        }
        rescale_if_moved(o, l_part, f);
        exponentiate(s, scale2, m0, l_part, p);
        // P_0 (at m_0, never rescaled) and m_0 for consumer 1, before this consumer's own
        // product: consumer 1's O += P_0 V_0[:, 256:512] then runs beside its softmax and
        // buffer 0 is free half a pair earlier than if P_0 waited for m_1. The tile is
        // rewritten only after the next S_0, which waits for buffer 0's second half, which the
        // producer refills only after consumer 1's product (the last reader of P_0) is done.
        publish_p(p0_s, p, row_max, m0, row0, qd);
        named_barrier_arrive(kBarM0P0, kConsumerThreads);
        stamp(local, pair, 1);

        // O += P_0 V_0[:, 0:256], then buffer 0's first half is free.
        wgmma_fence();
        pv_half_regs(o, p, k0_base, 0);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_pin(o);
        release(0, 0);
        stamp(local, pair, 2);

        // m_1 (>= m_0) and P_1 from consumer 1; O (and the row sums) move to m_1.
        named_barrier_sync(kBarM1P1, kConsumerThreads);
        stamp(local, pair, 3);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          m_run[r] = row_max[r == 0 ? row0 : row1];
          f[r] = exp2_ftz(m0[r] - m_run[r]);
        }
        rescale_if_moved(o, l_part, f);
        stamp(local, pair, 4);

        // O += P_1 V_1[:, 0:256], overlapped with the next pair's S_0.
        wgmma_fence();
        pv_half_smem(o, p1_base, k1_base, 0);
        wgmma_commit();
        if (pair + 1 < pairs) {
          issue_s0((ring + 1) & 1, true, pair);
        } else {
          wgmma_wait<0>();
          wgmma_pin(o);
          release(1, 0);  // O += P_1 V_1 is done
          stamp(local, pair, 5);
          stamp(local, pair, 6);
        }
        wgmma_wait<0>();
        wgmma_pin(s);
        wgmma_pin(o);
        stamp(local, pair, 7);
      }
    } else {
      for (int pair = 0; pair < pairs; ++pair, ++ring) {
        stamp(local, pair, 0);
        const std::uint32_t phase = ring & 1;
        // S_1 over buffer 1, second half first (the producer fills it before the first).
        wait_ready(ready_bar(1, 1), phase);
        stamp(local, pair, 1);
        fence_proxy_async_smem();
        wgmma_fence();
        qk_half(s, q_base, k1_base, 1, true);
        wgmma_commit();
        wait_ready(ready_bar(1, 0), phase);
        stamp(local, pair, 2);
        fence_proxy_async_smem();
        wgmma_fence();
        qk_half(s, q_base, k1_base, 0, false);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_pin(s);
        stamp(local, pair, 3);
        if (pair == pairs - 1 && lane == 0) mbar_arrive(q_empty_bar);  // last S of the item

        float mx[2];
        mask_and_max(s, (2 * pair + 1) * kKeys, n, scale2, qd, mx);
        named_barrier_sync(kBarM0P0, kConsumerThreads);
        stamp(local, pair, 4);
        // O to m_0, then O += P_0 V_0[:, 256:512] (P_0 from shared memory) in flight while
        // this consumer's softmax runs against m_1 = max(m_0, its own row maxima).
        float m0[2], m1[2], f[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          m0[r] = row_max[r == 0 ? row0 : row1];
          m1[r] = fmaxf(m0[r], mx[r]);
          f[r] = exp2_ftz(m_run[r] - m0[r]);
          m_run[r] = m1[r];
        }
        rescale_if_moved(o, l_part, f);
        wgmma_fence();
        pv_half_smem(o, p0_base, k0_base, 1);
        wgmma_commit();
        // The row sums move to m_1 now (before P_1's terms join them); O after its product.
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          f[r] = exp2_ftz(m0[r] - m1[r]);
          l_part[r] *= f[r];
        }
        exponentiate(s, scale2, m1, l_part, p);
        publish_p(p1_s, p, row_max, m1, row0, qd);
        named_barrier_arrive(kBarM1P1, kConsumerThreads);
        stamp(local, pair, 5);

        wgmma_wait<0>();
        wgmma_pin(o);
        release(0, 1);  // buffer 0 is done with
        rescale_if_moved(o, f);
        stamp(local, pair, 6);

        // O += P_1 V_1[:, 256:512], P_1 from registers.
        wgmma_fence();
        pv_half_regs(o, p, k1_base, 1);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_pin(o);
        release(1, 1);
        stamp(local, pair, 7);
      }
    }
    stamp_item(local, 2);

    // Row sums: the four lanes of a row, then the two consumers (fixed order). Both consumers
    // end on the same running max (m_1 of the last pair).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l_part[r] += __shfl_xor_sync(0xffffffffu, l_part[r], 1);
      l_part[r] += __shfl_xor_sync(0xffffffffu, l_part[r], 2);
    }
    float* sums = row_sum + (local & 1) * 2 * kRows;  // double-buffered by item
    if (qd == 0) {
      sums[c * kRows + row0] = l_part[0];
      sums[c * kRows + row1] = l_part[1];
    }
    named_barrier_sync(kBarSums, kConsumerThreads);
    const float l0 = sums[row0] + sums[kRows + row0];
    const float l1 = sums[row1] + sums[kRows + row1];
    const float inv[2] = {1.0f / l0, 1.0f / l1};
    // 8-byte stores: lane pairs (qd, qd ^ 1) swap one bf16 pair so that the even lane holds
    // dims 8i + 2qd .. +3 of column group i and the odd lane those of group i + 1.
    const bool odd = (qd & 1) != 0;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = r == 0 ? row0 : row1;
      bf16* orow = out + (static_cast<long>(t) * H + h0 + row) * kDim + 256 * c;
#pragma unroll
      for (int i = 0; i < 32; i += 2) {
        const std::uint32_t a = pack_bf16(o[4 * i + 2 * r] * inv[r], o[4 * i + 2 * r + 1] * inv[r]);
        const std::uint32_t b =
            pack_bf16(o[4 * (i + 1) + 2 * r] * inv[r], o[4 * (i + 1) + 2 * r + 1] * inv[r]);
        const std::uint32_t got = __shfl_xor_sync(0xffffffffu, odd ? a : b, 1);
        const int dim = odd ? 8 * (i + 1) + 2 * (qd - 1) : 8 * i + 2 * qd;
        if (h0 + row < H) st_global_v2_hint(orow + dim, odd ? got : a, odd ? b : got, stream_policy);
      }
    }
    if (c == 0 && qd == 0) {
      if (h0 + row0 < H) lse[static_cast<long>(t) * H + h0 + row0] = (m_run[0] + log2f(l0)) * kLn2;
      if (h0 + row1 < H) lse[static_cast<long>(t) * H + h0 + row1] = (m_run[1] + log2f(l1)) * kLn2;
    }
    stamp_item(local, 3);
  }
  if constexpr (kPair) cluster_sync_all();  // the peer may still arrive on or multicast into ours
}

}  // namespace

bool sparse_attention_wgmma_supported(const LayerDims& d) {
  // Both instances have the same shared memory; the plain one speaks for both.
  return d.head_dim == kDim &&
         wgmma_smem_bytes(d) <= dynamic_smem_limit(sparse_attention_wgmma_kernel<false>);
}

void launch_sparse_attention_wgmma(const LayerDims& d, const DeviceMetadata& meta, const bf16* q,
                                   const bf16* kv, const bf16* comp, const float* sink,
                                   const std::int32_t* topk, bf16* out, float* lse,
                                   cudaStream_t stream, unsigned* phase_stamps) {
  if (d.rows <= 0) return;
  require(d.head_dim == kDim, ErrorKind::Unsupported,
          "the wgmma attention kernel needs head_dim 512, got " + std::to_string(d.head_dim));
  require(d.scale > 0.0f, ErrorKind::InvalidArgument,
          "the wgmma attention kernel takes a positive softmax scale (its row maxima are taken before scaling)");
  const std::size_t smem = wgmma_smem_bytes(d);
  const int head_blocks = (d.heads + kRows - 1) / kRows;
  const long items = static_cast<long>(d.rows) * head_blocks;
  require(items < (1l << 31), ErrorKind::Unsupported, "too many attention rows for one launch");
  const int sms = multiprocessor_count();
  // The pair instance reads the key rows through TMA maps, whose bases must be 16-byte aligned.
  auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  if (head_blocks % 2 == 0 && aligned(kv) && aligned(comp)) {
    // A token's head blocks in pairs, each pair a cluster of two CTAs sharing every key tile's
    // gather (half the rows each). Persistent over the clusters that fit at once (a cluster's
    // two CTAs share a GPC, so possibly fewer than half the SMs); an even grid and an even
    // item count give both CTAs of a cluster the same token at every step. Where no cluster
    // fits, the plain instance below runs.
    auto kernel = sparse_attention_wgmma_kernel<true>;
    allow_dynamic_smem(kernel, smem, "the wgmma attention kernel (its shared memory grows with index_topk)");
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(sms / 2 * 2));
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = attr;
    config.numAttrs = 1;
    const int resident = max_active_clusters(kernel, config);
    if (resident > 0) {
      const long clusters = std::min<long>(items / 2, resident);
      config.gridDim = dim3(static_cast<unsigned>(2 * clusters));
      // The key rows as TMA maps of 128-byte boxes. The kernel's contract bounds the rows it
      // reads by the metadata (device memory), not by a host count: the maps take a bound no
      // real layer reaches (2^28 rows, 256 GB), so they guard nothing a pointer would not.
      // Without compressed rows (SWA) the comp map is never read: it maps kv.
      constexpr long kRowBound = 1l << 28;
      const CUtensorMap kv_map = bf16_rows_tensor_map(kv, kRowBound, kDim, 1, 64);
      const CUtensorMap comp_map = bf16_rows_tensor_map(comp != nullptr ? comp : kv, kRowBound, kDim, 1, 64);
      CSATTN_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, d, meta, q, kv, comp, kv_map, comp_map, sink, topk,
                                           out, lse, head_blocks, static_cast<int>(items), phase_stamps));
      return;
    }
  }
  auto kernel = sparse_attention_wgmma_kernel<false>;
  allow_dynamic_smem(kernel, smem, "the wgmma attention kernel (its shared memory grows with index_topk)");
  // Persistent: one CTA per multiprocessor (the kernel's shared memory allows one).
  const int grid = static_cast<int>(std::min<long>(items, sms));
  const CUtensorMap unused{};  // the plain instance gathers through pointers
  kernel<<<grid, kThreads, smem, stream>>>(d, meta, q, kv, comp, unused, unused, sink, topk, out, lse, head_blocks,
                                           static_cast<int>(items), phase_stamps);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
