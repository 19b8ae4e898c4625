// The kernel of the key-stationary compressed-row pass of the deterministic HCA backward
// (host side, contract and why: attention_backward_keyed.cu; the walk:
// attention_keyed_walk.cuh). Why wgmma: the first kernel, on mma.sync with 32 entries a CTA,
// was bound by shared-memory bytes (ldmatrix: ~0.9 MB a tile); wgmma reads its operands from
// shared memory once per warpgroup, and 64 entries a CTA halve the Q / dO reads per entry
// (measured on an H100, 2026-12-06: 96 -> 60 ms at 128K tokens).
//
// CTA (chunk c, key block kb): entries e0 = 64 kb .. e0 + 63, the same walk (rows ascending,
// head blocks in order, segments ascending). Two warpgroups, no producer. Per tile (one row,
// 64 heads), with the entries as the M dimension:
//   WG0: S^T = K Q^T   [64 entries x 64 heads] (m64n64k16 over 512 dims, both tiles K-major)
//        P^T = exp(S^T scale - LSE_h) on the visible entries, bf16, into the P tile
//   WG1: dP^T = K dO^T, then dS^T = scale P^T (dP^T - D_row,h) from the bf16 P tile (as the
//        query-stationary wgmma kernel takes P), bf16, into the dS tile
//   WG c: dK[64 x dims 256c .. +255] += P^T dO + dS^T Q (m64n256k16, the [heads x dims]
//        tiles read MN-major; its own product's operand from registers, the other from the
//        tile), 128 fp32 registers held across the whole walk.
// Shared memory (~209 KB): the key tile, Q and dO (64 KB each), P and dS (8 KB each), the
// tile's LSE and D_row. One buffer each; a warpgroup loads what its phase A needs (WG0: Q and
// LSE, WG1: dO and D_row) and waits only for its own copies. The products that read dO are
// committed first: once both warpgroups' are done, WG1 fetches the next dO while the Q
// products run; WG0 fetches the next Q after those (and starts S when it lands, while WG1
// may already be computing dP).
#include <algorithm>
#include <cmath>

#include "cuda/attention_keyed_walk.cuh"
#include "cuda/attention_row_terms.cuh"
#include "cuda/backward_kernels.hpp"
#include "cuda/check.hpp"
#include "cuda/device_util.cuh"
#include "cuda/mma_util.cuh"
#include "cuda/wgmma.cuh"
#include "cuda/wgmma_sync.cuh"
#include "cuda/wgmma_tile.cuh"

namespace csattn::cuda {

namespace {

constexpr int kDim = 512;
constexpr int kEntries = 64;  // compressed rows per CTA (the M dimension)
constexpr int kThreads = 256;
constexpr int kTileBytes = 64 * kDim * 2;  // a [64 x 512] bf16 tile
constexpr int kPairBytes = 64 * 64 * 2;    // a [64 x 64] bf16 tile
constexpr float kLog2e = kAttentionLog2e;
// Named barriers (0 is __syncthreads, not used: the warpgroups run separate loops): the key
// tile landed (all threads); a warpgroup's own copies landed (128 threads: WG0's Q, WG1's
// dO); P^T and dS^T handed over; both warpgroups' dO products done; all products done.
constexpr int kBarKeys = 1, kBarQ = 2, kBarDout = 3, kBarP = 4, kBarDs = 5, kBarDoutFree = 6,
              kBarFree = 7;

struct Smem {  // byte offsets from the 1024-aligned base
  static constexpr int keys = 0;
  static constexpr int q = keys + kTileBytes;
  static constexpr int dout = q + kTileBytes;
  static constexpr int p = dout + kTileBytes;
  static constexpr int ds = p + kPairBytes;
  static constexpr int lse2 = ds + kPairBytes;  // LSE * log2(e), +inf past H
  static constexpr int drow = lse2 + 64 * 4;
  static constexpr int bytes = drow + 64 * 4;
  static constexpr int alloc = bytes + 1024;  // room to align the base
};

// One warpgroup's walk. WG is a template parameter so that each warpgroup's wgmmas sit in a
// loop of their own (one loop branching on the warpgroup would serialise them, C7514).
template <int WG>
__device__ __forceinline__ void keyed_wgmma_walk(const LayerDims& d, const DeviceMetadata& meta,
                                                 const bf16* q, const float* lse, const float* drow,
                                                 const bf16* dout, float* out, const KeyedCta& cta,
                                                 int head_blocks, unsigned char* smem, std::uint32_t base) {
  const int H = d.heads;
  const int e0 = cta.e0, total = cta.total, r_lo = cta.r_lo, r_hi = cta.r_hi;
  const int wtid = threadIdx.x & 127, lane = threadIdx.x & 31, w4 = (threadIdx.x >> 5) & 3;
  const int g = lane >> 2, qd = lane & 3;
  const int row0 = 16 * w4 + g, row1 = row0 + 8;  // entries (local) of this thread's fragments
  const std::uint32_t k_base = base + Smem::keys, q_base = base + Smem::q, do_base = base + Smem::dout;
  const std::uint32_t p_base = base + Smem::p, ds_base = base + Smem::ds;
  float* lse2_s = reinterpret_cast<float*>(smem + Smem::lse2);
  float* drow_s = reinterpret_cast<float*>(smem + Smem::drow);

  // This warpgroup's share of a tile's loads: WG0 Q and LSE, WG1 dO and D_row.
  auto load = [&](const Walk& w) {
    const int h0 = w.hb * 64;
    load_q_tile<128>(WG == 0 ? q_base : do_base, WG == 0 ? q : dout, w.t, H, h0, wtid);
    if (wtid < 64) {
      const bool real = h0 + wtid < H;
      const long i = static_cast<long>(w.t) * H + h0 + wtid;
      if (WG == 0)
        lse2_s[wtid] = real ? lse[i] * kLog2e : INFINITY;  // P = exp2(-inf) = 0 past H
      else
        drow_s[wtid] = real ? drow[i] : 0.0f;
    }
  };

  Walk w = start_walk(d, meta, cta, kEntries);
  const int b_last = w.b_last;
  if (w.b <= b_last) load(w);
  cp_async_commit();
  cp_async_wait<1>();  // this thread's key rows (its first tile's copies may still fly)
  fence_proxy_async_smem();
  named_barrier_sync(kBarKeys, kThreads);  // every thread's key rows

  const float scale = d.scale, scale2 = d.scale * kLog2e;
  float dk[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) dk[i] = 0.0f;
  float s[32];          // WG0: S^T; WG1: dP^T
  std::uint32_t p[16];  // WG0: P^T; WG1: dS^T (bf16 pairs, the A fragment layout)

  while (w.b <= b_last) {
    int k_lo, k_hi;  // the tile's visible entries (local indices)
    visible_entries(w, d, meta, e0, kEntries, k_lo, k_hi);
    Walk nx = w;
    next_tile(nx, d, meta, e0, r_lo, r_hi, head_blocks);
    const bool more = nx.b <= b_last;

    cp_async_wait_all();  // this thread's copies of this tile's rows
    fence_proxy_async_smem();
    named_barrier_sync(WG == 0 ? kBarQ : kBarDout, 128);  // the warpgroup's copies and row terms

    wgmma_fence();
    qk_half(s, k_base, WG == 0 ? q_base : do_base, 0, true);
    qk_half(s, k_base, WG == 0 ? q_base : do_base, 1, false);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(s);

    const bool vis0 = row0 >= k_lo && row0 < k_hi, vis1 = row1 >= k_lo && row1 < k_hi;
    if (WG == 0) {
      // P^T: rows = entries, columns = heads 8 i + 2 qd (+1).
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int h = 8 * i + 2 * qd;
        const float l0 = lse2_s[h], l1 = lse2_s[h + 1];
        p[2 * i] = pack_bf16(vis0 ? exp2_ftz(fmaf(s[4 * i], scale2, -l0)) : 0.0f,
                             vis0 ? exp2_ftz(fmaf(s[4 * i + 1], scale2, -l1)) : 0.0f);
        p[2 * i + 1] = pack_bf16(vis1 ? exp2_ftz(fmaf(s[4 * i + 2], scale2, -l0)) : 0.0f,
                                 vis1 ? exp2_ftz(fmaf(s[4 * i + 3], scale2, -l1)) : 0.0f);
      }
      store_fragment(smem + Smem::p, p, row0, qd);
      fence_proxy_async_smem();  // st.shared -> WG1's wgmma
      named_barrier_sync(kBarP, kThreads);
      named_barrier_sync(kBarDs, kThreads);
    } else {
      named_barrier_sync(kBarP, kThreads);
      // dS^T = scale P^T (dP^T - D_row) with P^T as WG0 rounded it (same fragment positions).
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int h = 8 * i + 2 * qd;
        const float d0 = drow_s[h], d1 = drow_s[h + 1];
        const float2 pa = unpack_bf16(*reinterpret_cast<const std::uint32_t*>(smem + Smem::p + fragment_off(row0, i, qd)));
        const float2 pb = unpack_bf16(*reinterpret_cast<const std::uint32_t*>(smem + Smem::p + fragment_off(row1, i, qd)));
        p[2 * i] = pack_bf16(scale * pa.x * (s[4 * i] - d0), scale * pa.y * (s[4 * i + 1] - d1));
        p[2 * i + 1] = pack_bf16(scale * pb.x * (s[4 * i + 2] - d0), scale * pb.y * (s[4 * i + 3] - d1));
      }
      store_fragment(smem + Smem::ds, p, row0, qd);
      fence_proxy_async_smem();  // st.shared -> WG0's wgmma
      named_barrier_sync(kBarDs, kThreads);
    }

    // dK[:, 256 WG .. +255] += P^T dO (one commit group), then + dS^T Q (a second).
    wgmma_fence();
    if (WG == 0)
      pv_half_regs(dk, p, do_base, 0);
    else
      pv_half_smem(dk, p_base, do_base, 1);
    wgmma_commit();
    if (WG == 0)
      pv_half_smem(dk, ds_base, q_base, 0);
    else
      pv_half_regs(dk, p, q_base, 1);
    wgmma_commit();
    wgmma_wait<1>();  // this warpgroup's dO product
    named_barrier_sync(kBarDoutFree, kThreads);  // both warpgroups' (and WG1's D_row reads)
    if (WG == 1 && more) load(nx);  // the next dO and D_row, under the Q products
    wgmma_wait<0>();
    wgmma_pin(dk);
    named_barrier_sync(kBarFree, kThreads);  // Q, dS and the LSE free (P was at kBarDoutFree)
    if (WG == 0 && more) load(nx);
    cp_async_commit();
    w = nx;
  }
  cp_async_wait_all();

  // This chunk's partial sums of the block's entries (zeros where no row of the chunk sees
  // them): entries row0 / row1, dims 256 WG + 8 i + 2 qd (+1).
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int e = e0 + (half ? row1 : row0);
    if (e >= total) continue;
    float* dst = out + static_cast<long>(e) * kDim + 256 * WG + 2 * qd;
#pragma unroll
    for (int i = 0; i < 32; ++i)
      *reinterpret_cast<float2*>(dst + 8 * i) = make_float2(dk[4 * i + 2 * half], dk[4 * i + 2 * half + 1]);
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    comp_grad_keyed_wgmma_kernel(LayerDims d, DeviceMetadata meta, const bf16* q, const bf16* comp,
                                 const float* lse, const float* drow, const bf16* dout,
                                 float* partials, int key_blocks, int chunk_rows, int head_blocks) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + align_1024_pad(smem_raw);  // wgmma's swizzle atoms
  const std::uint32_t base = smem_addr(smem);

  const KeyedCta cta = keyed_cta(d, meta, key_blocks, chunk_rows, kEntries);
  if (cta.e0 >= cta.total) return;  // capacity rows without an entry: nobody reads their partials
  const int e0 = cta.e0, total = cta.total;

  // The 64 key rows (past the last entry: zeros, never visible), by all threads.
  for (int i = threadIdx.x; i < 64 * 64; i += kThreads) {
    const int r = i >> 6, ch = i & 63;
    const bool real = e0 + r < total;
    cp_async_16_zfill(base + Smem::keys + tile_off(r, ch), comp + static_cast<long>(real ? e0 + r : 0) * kDim + ch * 8,
                      real);
  }
  cp_async_commit();

  float* out = partials + static_cast<long>(cta.c) * d.comp_capacity * kDim;
  if (threadIdx.x < 128)
    keyed_wgmma_walk<0>(d, meta, q, lse, drow, dout, out, cta, head_blocks, smem, base);
  else
    keyed_wgmma_walk<1>(d, meta, q, lse, drow, dout, out, cta, head_blocks, smem, base);
}

}  // namespace

int comp_grad_keyed_wgmma_entries() { return kEntries; }

void launch_comp_grad_keyed_wgmma_kernel(const LayerDims& d, const DeviceMetadata& meta, const bf16* q,
                                         const bf16* comp, const float* lse, const float* drow,
                                         const bf16* dout, float* partials, long blocks, int key_blocks,
                                         int chunk_rows, int head_blocks, cudaStream_t stream) {
  allow_dynamic_smem(comp_grad_keyed_wgmma_kernel, Smem::alloc,
                     "the key-stationary compressed-row gradient (wgmma)");
  comp_grad_keyed_wgmma_kernel<<<static_cast<unsigned>(blocks), kThreads, Smem::alloc, stream>>>(
      d, meta, q, comp, lse, drow, dout, partials, key_blocks, chunk_rows, head_blocks);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
