// Warp-specialised wgmma sparse attention for head_dim 512 (Hopper, sm_90a); the contract of
// launch_sparse_attention (kernels.hpp), checked against sparse_attention_mma.cu.
//
// Work item = (query token, block of 64 heads): the heads of a token share one K=V head, so
// each gathered 64-key tile serves all 64 head rows. Persistent grid (one CTA per SM walks the
// items with stride gridDim.x). Three warpgroups:
//   WG0, producer (40 registers): builds each item's key list (CSA: compacts the top-k row),
//     gathers its key tiles (window rows contiguous, compressed rows by id) with 16-byte
//     cp.async into a 2-stage ring, completion signalled on the stage's `full` mbarrier
//     (cp.async.mbarrier.arrive.noinc); it waits on `empty` before reuse. It loads the item's Q
//     (q_full) once the consumers' last S of the previous item has read Q (q_empty), so the
//     next item's set-up overlaps the current item's last tiles and epilogue.
//   WG1, WG2, consumers c = 0, 1 (232 registers): consumer c computes S for keys
//     [32c, 32c + 32) of the tile over all 512 dims (32 x wgmma m64n32k16, A = Q, B = K tile,
//     both K-major), and owns output dims [256c, 256c + 256) (O: 64 x 256 fp32 = 128
//     registers). Per tile the consumers exchange their row maxima (named barrier 2), write
//     their half of P (bf16, 128B-swizzled [64 x 64]) to shared memory (named barrier 3), and
//     each runs O += P V over all 64 keys (4 x wgmma m64n256k16, A = P, B = the same key tile
//     read MN-major: V = K, its rows are keys = the reduction dim, dims contiguous = N).
// Shared memory (1024-byte aligned, every operand in 128-byte-swizzle atoms, see wgmma.cuh):
//   Q [64 x 512] 64 KB | 2 key stages [64 x 512] 128 KB | P [64 x 64] 8 KB | barriers, row
//   maxima / sums, key counts | CSA: the compacted top-k ids of the producer's item.
// A [R x 512] tile (R = 64 rows) is 8 column blocks of [R x 64 dims] (R x 128 bytes), row r at
// r * 128, 16-byte chunk c at c ^ (r % 8). K-major operands (Q, keys for S, P) step 8 rows by
// SBO = 1024; the MN-major V operand steps 8 keys by SBO = 1024 and 64 dims by LBO = 8 KB.
//
// Softmax as in the mma kernel: log2 domain, the sink as the initial running max (a zero-value
// logit, its exp counted once per row), slots past the key list -inf, LSE natural-log with the
// sink. Key order is the mma kernel's (window, then compressed: HCA all visible, CSA the valid
// top-k ids in the order given). Head rows past H are zero and never written.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/mma_util.cuh"
#include "cuda/wgmma.cuh"
#include "cuda/wgmma_sync.cuh"

namespace csattn::cuda {

namespace {

constexpr int kDim = 512;
constexpr int kRows = 64;   // head rows per CTA (one wgmma M)
constexpr int kKeys = 64;   // keys per tile
constexpr int kStages = 2;
constexpr int kProducerThreads = 128;
constexpr int kConsumerThreads = 256;
constexpr int kThreads = kProducerThreads + kConsumerThreads;
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;  // 128 x 40 + 256 x 232 <= 64K registers
static_assert(kProducerThreads * kProducerRegs + kConsumerThreads * kConsumerRegs <= 65536,
              "register file");
constexpr int kBlockBytes = 64 * 128;             // one [64 rows x 64 dims] column block
constexpr int kTileBytes = (kDim / 64) * kBlockBytes;  // [64 x 512] bf16 = 64 KB
constexpr int kQOff = 0;
constexpr int kKOff = kQOff + kTileBytes;
constexpr int kPOff = kKOff + kStages * kTileBytes;
constexpr int kBarOff = kPOff + kBlockBytes;         // full[2], empty[2], q_full, q_empty
constexpr int kMaxOff = kBarOff + (2 * kStages + 2) * 8;     // row maxima [2][64]
constexpr int kSumOff = kMaxOff + 2 * kRows * 4;             // row sums [2][64]
constexpr int kCountOff = kSumOff + 2 * kRows * 4;           // producer warp counts [4]
constexpr int kItemOff = kCountOff + (kProducerThreads / 32) * 4;  // key counts [2]
constexpr int kSelOff = kItemOff + 2 * 4;                    // CSA ids [topk]
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Byte offset of 16-byte chunk `chunk` (0..63) of row `row` in a swizzled [64 x 512] tile.
__device__ __forceinline__ std::uint32_t tile_off(int row, int chunk) {
  return static_cast<std::uint32_t>((chunk >> 3) * kBlockBytes + row * 128 +
                                    (((chunk & 7) ^ (row & 7)) << 4));
}

std::size_t wgmma_smem_bytes(const LayerDims& d) {
  // + 1 KB: the dynamic base is aligned up to 1024 bytes in the kernel.
  return 1024 + kSelOff + (d.ratio == 4 ? sizeof(int) * static_cast<std::size_t>(d.topk) : 0);
}

// The valid (>= 0) entries of a top-k row in their order, written to `out`; called by the
// producer warpgroup (named barrier kProducerBar). Loads are batched: one global round trip
// per 4 x 128 ids.
constexpr int kProducerBar = 5;
__device__ int compact_selection(const std::int32_t* sel, int K, int* out, int* warp_count) {
  constexpr int kBatch = 4;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int total = 0;
  for (int base = 0; base < K; base += kBatch * kProducerThreads) {
    int v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int k = base + j * kProducerThreads + tid;
      v[j] = k < K ? sel[k] : -1;
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (base + j * kProducerThreads >= K) break;  // uniform across the warpgroup
      const bool ok = v[j] >= 0;
      const unsigned ballot = __ballot_sync(0xffffffffu, ok);
      if (lane == 0) warp_count[warp] = __popc(ballot);
      named_barrier_sync(kProducerBar, kProducerThreads);
      int before = 0, all = 0;
#pragma unroll
      for (int w = 0; w < kProducerThreads / 32; ++w) {
        const int c = warp_count[w];
        before += w < warp ? c : 0;
        all += c;
      }
      if (ok) out[total + before + __popc(ballot & ((1u << lane) - 1u))] = v[j];
      total += all;
      named_barrier_sync(kProducerBar, kProducerThreads);  // warp_count is rewritten next
    }
  }
  return total;
}

// Persistent: CTA i handles work items i, i + gridDim.x, ... (item = token * head_blocks +
// head block). The producer runs ahead across items: it builds the next item's key list and
// streams its tiles into the same ring while the consumers finish the current item, and loads
// the next Q as soon as the consumers' last S of the current item has read Q (q_empty), so a
// CTA's set-up latency (metadata, top-k compaction, Q, first tiles) hides behind compute.
__global__ void __launch_bounds__(kThreads, 1)
    sparse_attention_wgmma_kernel(LayerDims d, DeviceMetadata meta, const bf16* q,
                                  const bf16* kv, const bf16* comp, const float* sink,
                                  const std::int32_t* topk, bf16* out, float* lse,
                                  int head_blocks, int items) {
  extern __shared__ unsigned char smem_raw[];
  // wgmma's 128B swizzle is anchored at 1024-byte boundaries (descriptor base offset 0).
  const std::uint32_t raw = smem_addr(smem_raw);
  unsigned char* smem = smem_raw + (((raw + 1023u) & ~1023u) - raw);
  const std::uint32_t base = smem_addr(smem);
  float* row_max = reinterpret_cast<float*>(smem + kMaxOff);
  float* row_sum = reinterpret_cast<float*>(smem + kSumOff);
  int* warp_count = reinterpret_cast<int*>(smem + kCountOff);
  int* item_keys = reinterpret_cast<int*>(smem + kItemOff);  // key count per item, [2]
  int* sel_s = reinterpret_cast<int*>(smem + kSelOff);
  auto full_bar = [&](int s) { return base + kBarOff + 8u * s; };
  auto empty_bar = [&](int s) { return base + kBarOff + 8u * (kStages + s); };
  const std::uint32_t q_full_bar = base + kBarOff + 8u * (2 * kStages);
  const std::uint32_t q_empty_bar = q_full_bar + 8u;

  const int H = d.heads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_bar(s), kProducerThreads);          // one cp.async arrival per thread
      mbar_init(empty_bar(s), kConsumerThreads / 32);    // one arrival per consumer warp
    }
    mbar_init(q_full_bar, kProducerThreads + 1);  // cp.async arrivals + the key count's
    mbar_init(q_empty_bar, kConsumerThreads / 32);
    mbar_init_fence();
  }
  __syncthreads();

  if (warp < kProducerThreads / 32) {
    // ---------------- producer: key lists, Q, key tiles ----------------
    setmaxnreg_dec<kProducerRegs>();
    const bool csa = d.ratio == 4;
    int ring = 0;  // tiles issued so far (ring slot and phase)
    int local = 0;
    for (int item = blockIdx.x; item < items; item += gridDim.x, ++local) {
      const int t = item / head_blocks, h0 = (item % head_blocks) * kRows;
      // The next item's Q rows (64 KB, contiguous) and top-k row into L2 while this one runs:
      // its set-up then waits on L2, not device memory.
      if (item + static_cast<int>(gridDim.x) < items) {
        const int nt = (item + gridDim.x) / head_blocks, nh = ((item + gridDim.x) % head_blocks) * kRows;
        const char* qn = reinterpret_cast<const char*>(q + (static_cast<long>(nt) * H + nh) * kDim);
        const int q_lines = min(kRows, H - nh) * (kDim * 2 / 128);
        for (int i = tid; i < q_lines; i += kProducerThreads) prefetch_l2(qn + i * 128);
        if (csa) {
          const char* tn = reinterpret_cast<const char*>(topk + static_cast<long>(nt) * d.topk);
          for (int i = tid; i < (d.topk * 4 + 127) / 128; i += kProducerThreads) prefetch_l2(tn + i * 128);
        }
      }
      // The key list (same order as build_key_list): window rows, then compressed rows.
      const int b = meta.row_segment[t], pos = meta.row_position[t];
      const int w0 = max(0, pos - d.window + 1), n_win = pos - w0 + 1;
      const int comp0 = meta.comp_start[b];
      int n_comp;
      if (csa)
        n_comp = compact_selection(topk + static_cast<long>(t) * d.topk, d.topk, sel_s, warp_count);
      else
        n_comp = d.ratio > 1 ? min((pos + 1) / d.ratio, meta.comp_start[b + 1] - comp0) : 0;
      const int n = n_win + n_comp;
      const int tiles = (n + kKeys - 1) / kKeys;
      const bf16* win_base = kv + (static_cast<long>(meta.cu_padded[b]) + w0) * kDim;
      const bf16* comp_base = comp + static_cast<long>(comp0) * kDim;

      // Q of this item once the consumers' S no longer reads the previous one (issued after
      // this item's first tile, so that tile's gather overlaps the wait); rows past H are
      // zero-filled by the copy itself (source size 0).
      auto load_q = [&]() {
        mbar_wait(q_empty_bar, (local & 1) ^ 1);
        for (int i = tid; i < kRows * 64; i += kProducerThreads) {
          const int r = i >> 6, c = i & 63;
          const bool real = h0 + r < H;
          cp_async_16_zfill(base + kQOff + tile_off(r, c),
                            q + (static_cast<long>(t) * H + (real ? h0 + r : 0)) * kDim + c * 8,
                            real);
        }
        cp_async_mbar_arrive(q_full_bar);
        if (tid == 0) {
          item_keys[local & 1] = n;
          mbar_arrive(q_full_bar);  // release: the key count is visible with the phase
        }
      };
      if (tiles == 0) load_q();
      auto key_row = [&](int slot) -> const bf16* {
        if (slot >= n) slot = 0;  // past the list: a real row (finite), masked by the consumers
        if (slot < n_win) return win_base + static_cast<long>(slot) * kDim;
        const int j = slot - n_win;
        return comp_base + static_cast<long>(csa ? sel_s[j] : j) * kDim;
      };
      for (int tile = 0; tile < tiles; ++tile, ++ring) {
        const int s = ring % kStages;
        mbar_wait(empty_bar(s), ((ring / kStages) & 1) ^ 1);
        // Warp w gathers rows 16w..16w+15; lane j < 16 resolves row 16w + j.
        const bf16* mine = key_row(tile * kKeys + warp * 16 + (lane & 15));
        const std::uint32_t dst = base + kKOff + s * kTileBytes;
#pragma unroll 4
        for (int j = 0; j < 16; ++j) {
          const bf16* src = reinterpret_cast<const bf16*>(
              __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(mine), j));
          const int r = warp * 16 + j;
          // 32 lanes x 16 bytes = 512 contiguous bytes of the row per instruction.
          cp_async_16(dst + tile_off(r, lane), src + lane * 8);
          cp_async_16(dst + tile_off(r, lane + 32), src + (lane + 32) * 8);
        }
        cp_async_mbar_arrive(full_bar(s));
        if (tile == 0) load_q();
      }
      // sel_s is rewritten by the next item's compaction only after every lane of the
      // warpgroup resolved its rows of this item.
      named_barrier_sync(kProducerBar, kProducerThreads);
    }
    cp_async_wait_all();
  } else {
    // ---------------- consumers ----------------
    setmaxnreg_inc<kConsumerRegs>();
    const int c = warp / 4 - 1;           // consumer index: keys [32c, 32c+32), dims [256c, +256)
    const int g = lane >> 2, qd = lane & 3;
    const int row0 = 16 * (warp & 3) + g, row1 = row0 + 8;
    const float scale2 = d.scale * kLog2e;
    const std::uint32_t q_base = base + kQOff, p_base = base + kPOff;
    unsigned char* p_s = smem + kPOff;
    int ring = 0;
    int local = 0;
    for (int item = blockIdx.x; item < items; item += gridDim.x, ++local) {
      const int t = item / head_blocks, h0 = (item % head_blocks) * kRows;
      mbar_wait(q_full_bar, local & 1);
      fence_proxy_async_smem();  // the producer's cp.async writes of Q -> wgmma
      const int n = item_keys[local & 1];
      const int tiles = (n + kKeys - 1) / kKeys;
      if (tiles == 0 && lane == 0) mbar_arrive(q_empty_bar);  // no S reads this Q

      float m_run[2] = {(h0 + row0 < H ? sink[h0 + row0] : 0.0f) * kLog2e,
                        (h0 + row1 < H ? sink[h0 + row1] : 0.0f) * kLog2e};
      // The sink's exp(sigma - m) = 1 with m = sigma, counted by one thread of the row.
      float l_part[2] = {c == 0 && qd == 0 ? 1.0f : 0.0f, c == 0 && qd == 0 ? 1.0f : 0.0f};
      float o[128];
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] = 0.0f;

      for (int tile = 0; tile < tiles; ++tile, ++ring) {
        const int s = ring % kStages;
        mbar_wait(full_bar(s), (ring / kStages) & 1);
        fence_proxy_async_smem();  // the producer's cp.async writes -> this warpgroup's wgmma
        const std::uint32_t k_base = base + kKOff + s * kTileBytes;

        // S [64 rows x 32 keys] over 512 dims: 32 k16 steps, 4 per 64-dim column block.
        float sacc[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) sacc[i] = 0.0f;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kDim / 16; ++kk) {
          const std::uint32_t a = q_base + (kk >> 2) * kBlockBytes + (kk & 3) * 32;
          const std::uint32_t bk = k_base + (kk >> 2) * kBlockBytes + c * 32 * 128 + (kk & 3) * 32;
          wgmma_m64n32k16_ss<0>(sacc, wgmma_desc_sw128(a, 16, 1024),
                                wgmma_desc_sw128(bk, 16, 1024), kk > 0 ? 1 : 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_pin(sacc);
        // The last S of the item has read Q: the producer may load the next item's.
        if (tile == tiles - 1 && lane == 0) mbar_arrive(q_empty_bar);

        // Online softmax in the log2 domain; slots past the key list are -inf.
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int key = tile * kKeys + 32 * c + 8 * i + 2 * qd + (j & 1);
            const float v = key < n ? sacc[4 * i + j] * scale2 : -INFINITY;
            sacc[4 * i + j] = v;
            mx[j >> 1] = fmaxf(mx[j >> 1], v);
          }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        }
        if (qd == 0) {
          row_max[c * kRows + row0] = mx[0];
          row_max[c * kRows + row1] = mx[1];
        }
        named_barrier_sync(2, kConsumerThreads);
        // Same expression in both consumers (fixed operand order): identical m in both.
        const float tmax[2] = {fmaxf(row_max[row0], row_max[kRows + row0]),
                               fmaxf(row_max[row1], row_max[kRows + row1])};
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float m_new = fmaxf(m_run[r], tmax[r]);
          corr[r] = exp2f(m_run[r] - m_new);
          m_run[r] = m_new;
        }
        float sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          sacc[i] = exp2f(sacc[i] - m_run[(i >> 1) & 1]);
          sum[(i >> 1) & 1] += sacc[i];
        }
        l_part[0] = l_part[0] * corr[0] + sum[0];
        l_part[1] = l_part[1] * corr[1] + sum[1];
        // This consumer's half of P into the swizzled [64 x 64] bf16 tile (chunk 4c + i).
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int chunk = 4 * c + i;
          *reinterpret_cast<std::uint32_t*>(p_s + row0 * 128 + ((chunk ^ (row0 & 7)) << 4) + qd * 4) =
              pack_bf16(sacc[4 * i], sacc[4 * i + 1]);
          *reinterpret_cast<std::uint32_t*>(p_s + row1 * 128 + ((chunk ^ (row1 & 7)) << 4) + qd * 4) =
              pack_bf16(sacc[4 * i + 2], sacc[4 * i + 3]);
        }
        fence_proxy_async_smem();  // P's st.shared -> both consumers' wgmma
        named_barrier_sync(3, kConsumerThreads);

#pragma unroll
        for (int i = 0; i < 32; ++i) {
          o[4 * i] *= corr[0];
          o[4 * i + 1] *= corr[0];
          o[4 * i + 2] *= corr[1];
          o[4 * i + 3] *= corr[1];
        }
        // O [64 x 256] += P [64 x 64 keys] V [64 keys x dims 256c..256c+255]: 4 k16 steps; V's
        // step kk starts at key row 16 kk (2 KB), its 4 column blocks are LBO = 8 KB apart.
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kKeys / 16; ++kk) {
          const std::uint32_t a = p_base + kk * 32;
          const std::uint32_t bv = k_base + 4 * c * kBlockBytes + kk * 16 * 128;
          wgmma_m64n256k16_ss<1>(o, wgmma_desc_sw128(a, 16, 1024),
                                 wgmma_desc_sw128(bv, kBlockBytes, 1024), 1);
        }
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_pin(o);
        if (lane == 0) mbar_arrive(empty_bar(s));  // this warp is done with the stage
      }

      // Row sums: the four lanes of a row, then the two consumers (fixed order).
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        l_part[r] += __shfl_xor_sync(0xffffffffu, l_part[r], 1);
        l_part[r] += __shfl_xor_sync(0xffffffffu, l_part[r], 2);
      }
      if (qd == 0) {
        row_sum[c * kRows + row0] = l_part[0];
        row_sum[c * kRows + row1] = l_part[1];
      }
      named_barrier_sync(2, kConsumerThreads);
      const float l0 = row_sum[row0] + row_sum[kRows + row0];
      const float l1 = row_sum[row1] + row_sum[kRows + row1];
      named_barrier_sync(3, kConsumerThreads);  // both have read row_sum before its reuse
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
          if (h0 + row < H)
            *reinterpret_cast<uint2*>(orow + dim) = odd ? make_uint2(got, b) : make_uint2(a, got);
        }
      }
      if (c == 0 && qd == 0) {
        if (h0 + row0 < H) lse[static_cast<long>(t) * H + h0 + row0] = (m_run[0] + log2f(l0)) * kLn2;
        if (h0 + row1 < H) lse[static_cast<long>(t) * H + h0 + row1] = (m_run[1] + log2f(l1)) * kLn2;
      }
    }
  }
}

}  // namespace

bool sparse_attention_wgmma_supported(const LayerDims& d) {
  return d.head_dim == kDim && wgmma_smem_bytes(d) <= 227 * 1024;
}

void launch_sparse_attention_wgmma(const LayerDims& d, const DeviceMetadata& meta, const bf16* q,
                                   const bf16* kv, const bf16* comp, const float* sink,
                                   const std::int32_t* topk, bf16* out, float* lse,
                                   cudaStream_t stream) {
  if (d.rows <= 0) return;
  require(d.head_dim == kDim, ErrorKind::Unsupported,
          "the wgmma attention kernel needs head_dim 512, got " + std::to_string(d.head_dim));
  const std::size_t smem = wgmma_smem_bytes(d);
  require(smem <= 227 * 1024, ErrorKind::Unsupported,
          "the wgmma attention kernel needs " + std::to_string(smem) +
              " bytes of shared memory for top-k " + std::to_string(d.topk));
  allow_dynamic_smem(sparse_attention_wgmma_kernel, smem, "the wgmma attention kernel");
  const int head_blocks = (d.heads + kRows - 1) / kRows;
  const long items = static_cast<long>(d.rows) * head_blocks;
  require(items < (1l << 31), ErrorKind::Unsupported, "too many attention rows for one launch");
  // Persistent: one CTA per multiprocessor (the kernel's shared memory allows one).
  const int sms = multiprocessor_count();
  const int grid = static_cast<int>(std::min<long>(items, sms));
  sparse_attention_wgmma_kernel<<<grid, kThreads, smem, stream>>>(
      d, meta, q, kv, comp, sink, topk, out, lse, head_blocks, static_cast<int>(items));
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
