// The deterministic key gradients of HCA's compressed rows, key-stationary (see
// backward_kernels.hpp, launch_comp_grad_keyed). Why: the deterministic backward's scratch
// holds one fp32 row per (query, key slot), and an HCA query has W + L / 128 slots, so the
// scratch traffic grows as T x L / 256 x 2 KB each way (34 GB at 64K tokens, 8.8 TB at 1M). Here each
// CTA owns 32 compressed rows and walks the queries that see them in ascending row order,
// recomputing P and dS from the saved LSE and D_row, so every sum has one fixed order and
// nothing per (query, slot) is stored: the traffic is the Q / dO rows read once per 32
// entries and the per-chunk partial sums.
//
// CTA (chunk c, key block kb): entries e0 = 32 kb .. e0 + 31 (global compressed rows, which may
// span several short segments), query rows [c R, (c + 1) R) of their segments, in ascending
// row order, each row's head blocks of 64 in order. Per tile (one row, 64 heads):
//   S  = Q K^T, dP = dO K^T                       [64 x 32]  phase A (dP first, then S)
//   P  = exp(S scale - LSE), dS = scale P (dP - D_row), both rounded to bf16 (as the
//        query-stationary kernels round them before their products)
//   dK += P^T dO + dS^T Q                          [32 x 512] phase C (registers, all tiles)
// Entry j of segment b is seen by the rows of b at positions p with j < (p + 1) / ratio
// (the key list of attention_keys.cuh, the ordered scatter's predicate). Eight warps in two
// groups of four: group 0 loads dO (and the row terms) and computes dP, group 1 loads Q and
// computes S, then P and dS from S and group 0's dP (handed over in shared memory); each warp
// takes 16 rows x all 32 keys over the full 512 dims. Then
//   C: each warp 32 keys x 64 dims (an eighth of them) = 64 fp32 registers per thread, held
//      across the whole walk.
// Both mappings were chosen for shared-memory traffic, which bounds this kernel (ldmatrix
// bytes a tile: phase A 3 loads per 4 MMAs instead of 2 per 2, phase C 6 per 16 instead of
// 9 per 16 - ~25% and ~33% less than the first version's 16 x 16 / 16 x 128 warp tiles).
// Shared memory (~177 KB): Q and dO (64 KB each, swizzled), the 32 key rows (32 KB), P and dS
// (4 KB each), the tile's LSE and D_row, dP in fp32 (8 KB). One buffer each: the next tile's
// dO is fetched while dS^T Q runs, its Q while dP runs (the groups wait only for their own
// copies, so group 0 starts dP while Q is still landing).
#include <algorithm>
#include <cmath>
#include <string>

#include "cuda/backward_kernels.hpp"
#include "cuda/attention_keyed_walk.cuh"
#include "cuda/attention_mma_tiles.cuh"
#include "cuda/attention_row_terms.cuh"
#include "cuda/check.hpp"
#include "cuda/device_util.cuh"
#include "cuda/kernel_switch.hpp"
#include "cuda/mma_util.cuh"
#include "cuda/wgmma_sync.cuh"

namespace csattn::cuda {

namespace {

using mma_tiles::kChunks;
using mma_tiles::kDim;
using mma_tiles::kRowBytes;
using mma_tiles::kTileRowBytes;
using mma_tiles::pswz;
using mma_tiles::swz;
constexpr int kRows = 64;                    // head rows per tile
constexpr int kKeys = mma_tiles::kTileKeys;  // compressed rows per CTA
constexpr int kThreads = 256;
constexpr float kLog2e = kAttentionLog2e;
// The grid aims at this many CTAs (chunks x key blocks): ~8 waves of 132 SMs, so that the
// triangular work (early entries are seen by more rows) spreads; no more chunks than 64-row
// pieces of the batch.
constexpr int kTargetCtas = 1024;
constexpr int kMinChunkRows = 64;

struct Smem {  // byte offsets into the dynamic shared memory
  static constexpr int q = 0;
  static constexpr int dout = q + kRows * kRowBytes;
  static constexpr int keys = dout + kRows * kRowBytes;
  static constexpr int p = keys + kKeys * kRowBytes;
  static constexpr int ds = p + kRows * kTileRowBytes;
  static constexpr int lse2 = ds + kRows * kTileRowBytes;  // LSE * log2(e), +inf past H
  static constexpr int drow = lse2 + kRows * 4;
  static constexpr int dp = drow + kRows * 4;  // fp32, group 0's fragments in register order
  static constexpr int bytes = dp + kRows * kKeys * 4;
};
// Named barriers (0 is __syncthreads): a group's own copies landed; dP handed over.
constexpr int kBarDout = 1, kBarQ = 2, kBarDp = 3;
constexpr int kGroupThreads = kThreads / 2;

// CSATTN_HCA_DET_GRADS: "" (this file's mma.sync kernel), "scratch" (no keyed pass: the
// per-(row, slot) scratch) or "wgmma" (attention_backward_keyed_wgmma.cu, 64 entries a CTA).
const std::string& det_grads_switch() {
  static const std::string value = kernel_switch("CSATTN_HCA_DET_GRADS", {"scratch", "wgmma"});
  return value;
}
bool on_wgmma(KeyedKernel k) {
  return k == KeyedKernel::wgmma || (k == KeyedKernel::automatic && det_grads_switch() == "wgmma");
}
int entries_per_cta(KeyedKernel k) { return on_wgmma(k) ? comp_grad_keyed_wgmma_entries() : kKeys; }
int key_blocks_of(const LayerDims& d, KeyedKernel k) {
  return (d.comp_capacity + entries_per_cta(k) - 1) / entries_per_cta(k);
}

__global__ void __launch_bounds__(kThreads, 1)
    comp_grad_keyed_kernel(LayerDims d, DeviceMetadata meta, const bf16* q, const bf16* comp,
                           const float* lse, const float* drow, const bf16* dout,
                           float* partials, int key_blocks, int chunk_rows, int head_blocks) {
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* q_s = smem + Smem::q;
  unsigned char* do_s = smem + Smem::dout;
  unsigned char* k_s = smem + Smem::keys;
  unsigned char* p_s = smem + Smem::p;
  unsigned char* ds_s = smem + Smem::ds;
  float* lse2_s = reinterpret_cast<float*>(smem + Smem::lse2);
  float* drow_s = reinterpret_cast<float*>(smem + Smem::drow);
  float4* dp_s = reinterpret_cast<float4*>(smem + Smem::dp);

  const int H = d.heads;
  const KeyedCta cta = keyed_cta(d, meta, key_blocks, chunk_rows, kKeys);
  if (cta.e0 >= cta.total) return;  // capacity rows without an entry: nobody reads their partials
  const int c = cta.c, e0 = cta.e0, total = cta.total, r_lo = cta.r_lo, r_hi = cta.r_hi;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, qd = lane & 3;

  // The 32 key rows (past the last entry: zeros, never visible).
  for (int i = tid; i < kKeys * kChunks; i += kThreads) {
    const int r = i / kChunks, ch = i % kChunks;
    if (e0 + r < total)
      cp_async_16(smem_addr(k_s + swz(r, ch)), comp + static_cast<long>(e0 + r) * kDim + ch * 8);
    else
      *reinterpret_cast<uint4*>(k_s + swz(r, ch)) = make_uint4(0u, 0u, 0u, 0u);
  }
  cp_async_commit();

  // One tile's rows, by one group's threads: dO or Q of row t, heads 64 hb .. + 63 (zeros past
  // H), and (with dO) the rows' LSE and D_row (plain stores: read after the next barrier).
  const int group = warp >> 2, gt = tid & (kGroupThreads - 1);
  auto load_rows = [&](const Walk& w, unsigned char* dst, const bf16* src, bool terms) {
    const int h0 = w.hb * kRows;
    for (int i = gt; i < kRows * kChunks; i += kGroupThreads) {
      const int r = i / kChunks, ch = i % kChunks;
      if (h0 + r < H)
        cp_async_16(smem_addr(dst + swz(r, ch)),
                    src + (static_cast<long>(w.t) * H + h0 + r) * kDim + ch * 8);
      else
        *reinterpret_cast<uint4*>(dst + swz(r, ch)) = make_uint4(0u, 0u, 0u, 0u);
    }
    if (terms && gt < kRows) {
      const bool real = h0 + gt < H;
      const long i = static_cast<long>(w.t) * H + h0 + gt;
      lse2_s[gt] = real ? lse[i] * kLog2e : INFINITY;  // P = exp2(-inf) = 0 past H
      drow_s[gt] = real ? drow[i] : 0.0f;
    }
  };

  Walk w = start_walk(d, meta, cta, kKeys);
  const int b_last = w.b_last;
  if (w.b <= b_last) {  // group 0: dO and the row terms; group 1: Q
    if (group == 0)
      load_rows(w, do_s, dout, true);
    else
      load_rows(w, q_s, q, false);
  }
  cp_async_commit();
  cp_async_wait<1>();  // this thread's key rows
  __syncthreads();     // every thread's key rows (and the first row terms' plain stores)

  const float scale = d.scale, scale2 = d.scale * kLog2e;
  const int wr = warp & 3;  // phase A: rows 16 wr, all 32 keys
  const int dq8 = warp;     // phase C: all 32 keys, dims 64 dq8
  float acc[2][8][4];       // phase C: keys 16 mt, dims 64 dq8 + 8 j
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.0f;

  // Phase C's operand addressing (attention_backward_mma.cu): A = P^T / dS^T by transposed
  // ldmatrix from the [head][key] tiles, matrix m of the x4 holding heads + 8 (m >> 1) and
  // keys + 8 (m & 1); B = dO / Q by transposed ldmatrix.
  const int m4 = lane >> 3;
  const int a_head = (lane & 7) + ((m4 >> 1) << 3), a_chunk = m4 & 1;
  const int b_head = (lane & 7) + (((lane >> 3) & 1) << 3);
  auto product = [&](const unsigned char* a_tile, const unsigned char* b_tile) {
#pragma unroll
    for (int ks = 0; ks < kRows / 16; ++ks) {
      std::uint32_t a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
        ldmatrix_x4_trans(smem_addr(a_tile + pswz(16 * ks + a_head, 2 * mt + a_chunk)), a[mt]);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        const int chunk = (dq8 * 64 + np * 16) / 8 + (lane >> 4);
        std::uint32_t bv[4];
        ldmatrix_x4_trans(smem_addr(b_tile + swz(16 * ks + b_head, chunk)), bv);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma_bf16(acc[mt][2 * np], a[mt], bv[0], bv[1]);
          mma_bf16(acc[mt][2 * np + 1], a[mt], bv[2], bv[3]);
        }
      }
    }
  };

  // Phase A's K^T product over all 512 dims for rows 16 wr (A from `a_tile`), all 32 keys:
  // s[j] holds keys 8 j + 2 qd (+1) of rows g and g + 8.
  auto scores = [&](const unsigned char* a_tile, float (&s)[4][4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll 4
    for (int ks = 0; ks < kDim / 16; ++ks) {
      const int chunk0 = ks * 2;
      std::uint32_t a[4];
      ldmatrix_x4(smem_addr(a_tile + swz(16 * wr + (lane & 15), chunk0 + (lane >> 4))), a);
#pragma unroll
      for (int kq = 0; kq < 2; ++kq) {
        std::uint32_t bk[4];
        const int key = 16 * kq + (lane & 7) + ((lane >> 4) << 3);
        ldmatrix_x4(smem_addr(k_s + swz(key, chunk0 + ((lane >> 3) & 1))), bk);
        mma_bf16(s[2 * kq], a, bk[0], bk[1]);
        mma_bf16(s[2 * kq + 1], a, bk[2], bk[3]);
      }
    }
  };

  while (w.b <= b_last) {
    int k_lo, k_hi;  // the tile's visible entries (local indices)
    visible_entries(w, d, meta, e0, kKeys, k_lo, k_hi);
    Walk nx = w;
    next_tile(nx, d, meta, e0, r_lo, r_hi, head_blocks);
    const bool more = nx.b <= b_last;

    // Each group waits for its own copies only (cp.async completion is per thread), then
    // for the rest of its group's.
    cp_async_wait<0>();
    float sc[4][4];
    if (group == 0) {  // dP = dO K^T, handed to group 1 in register order
      named_barrier_sync(kBarDout, kGroupThreads);
      scores(do_s, sc);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        dp_s[(wr * 4 + j) * 32 + lane] = make_float4(sc[j][0], sc[j][1], sc[j][2], sc[j][3]);
      named_barrier_arrive(kBarDp, kThreads);
    } else {  // S = Q K^T, then P and scale * dS as bf16 into the [64 x 32] tiles
      named_barrier_sync(kBarQ, kGroupThreads);
      scores(q_s, sc);
      named_barrier_sync(kBarDp, kThreads);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 dp4 = dp_s[(wr * 4 + j) * 32 + lane];
        const float dp[4] = {dp4.x, dp4.y, dp4.z, dp4.w};
        const int key = 8 * j + 2 * qd;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = 16 * wr + g + 8 * half;
          const float l2 = lse2_s[row], dr = drow_s[row];
          float pv[2], dv[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {  // invisible keys get 0
            const bool vis = key + e >= k_lo && key + e < k_hi;
            pv[e] = vis ? exp2f(sc[j][2 * half + e] * scale2 - l2) : 0.0f;
            dv[e] = scale * pv[e] * (dp[2 * half + e] - dr);
          }
          const int off = pswz(row, key >> 3) + (key & 7) * 2;
          *reinterpret_cast<std::uint32_t*>(p_s + off) = pack_bf16(pv[0], pv[1]);
          *reinterpret_cast<std::uint32_t*>(ds_s + off) = pack_bf16(dv[0], dv[1]);
        }
      }
    }
    __syncthreads();  // P, dS complete; dO and Q visible to all; the row terms and dP read
    product(p_s, do_s);  // += P^T dO
    __syncthreads();     // dO free
    if (more && group == 0) load_rows(nx, do_s, dout, true);
    cp_async_commit();
    product(ds_s, q_s);  // += dS^T Q
    __syncthreads();     // Q, P, dS free
    if (more && group == 1) load_rows(nx, q_s, q, false);
    cp_async_commit();
    w = nx;
  }
  cp_async_wait<0>();

  // This chunk's partial sums of the block's entries (zeros where no row of the chunk sees
  // them): rows 16 mt + g (+8), dims 64 dq8 + 8 j + 2 qd (+1).
  float* out = partials + static_cast<long>(c) * d.comp_capacity * kDim;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int e = e0 + 16 * mt + g + 8 * half;
      if (e >= total) continue;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        *reinterpret_cast<float2*>(out + static_cast<long>(e) * kDim + dq8 * 64 + 8 * j + 2 * qd) =
            make_float2(acc[mt][j][2 * half], acc[mt][j][2 * half + 1]);
    }
}

// dst[e] = sum over the chunks in order of partials[c][e], for the entries e < total.
__global__ void sum_chunks_kernel(const float* partials, int chunks, long chunk_floats,
                                  const std::int32_t* comp_start, int segments, float* dst) {
  const long total4 = static_cast<long>(comp_start[segments]) * (kDim / 4);
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < total4;
       i += static_cast<long>(gridDim.x) * blockDim.x) {
    float4 s = reinterpret_cast<const float4*>(partials)[i];
    for (int c = 1; c < chunks; ++c) {
      const float4 v = reinterpret_cast<const float4*>(partials + c * chunk_floats)[i];
      s.x += v.x;
      s.y += v.y;
      s.z += v.z;
      s.w += v.w;
    }
    reinterpret_cast<float4*>(dst)[i] = s;
  }
}

// D_row = dO . O for every (row, head): a warp a row of 512, 16-byte loads.
__global__ void row_dot_kernel(const bf16* out, const bf16* dout, long rows, float* drow) {
  const int lane = threadIdx.x & 31;
  for (long r = (blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x) >> 5; r < rows;
       r += (static_cast<long>(gridDim.x) * blockDim.x) >> 5) {
    // attention_row_terms' order: lane l's dims 8 l .. + 7, then 256 + 8 l .. + 7.
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const long off = r * kDim + 256 * k + 8 * lane;
      acc += dot_bf16x8(out + off, dout + off);
    }
    acc = warp_sum(acc);
    if (lane == 0) drow[r] = acc;
  }
}

}  // namespace

bool comp_grad_keyed_applies(const LayerDims& d) {
  return d.ratio > 1 && d.ratio != 4 && d.head_dim == kDim && d.comp_capacity > 0;
}

bool deterministic_comp_keyed(const LayerDims& d) {
  // CSATTN_HCA_DET_GRADS=scratch: the per-(row, slot) scratch for HCA's compressed rows too
  // (the A/B of the keyed pass).
  return det_grads_switch() != "scratch" && comp_grad_keyed_applies(d);
}

int comp_grad_keyed_chunks(const LayerDims& d, KeyedKernel kernel) {
  const int blocks = std::max(1, key_blocks_of(d, kernel));
  const int by_rows = std::max(1, (d.rows + kMinChunkRows - 1) / kMinChunkRows);
  return std::max(1, std::min((kTargetCtas + blocks - 1) / blocks, by_rows));
}

std::size_t comp_grad_keyed_scratch_bytes(const LayerDims& d, KeyedKernel kernel) {
  const int chunks = comp_grad_keyed_chunks(d, kernel);
  return chunks > 1 ? sizeof(float) * static_cast<std::size_t>(chunks) *
                          static_cast<std::size_t>(d.comp_capacity) * kDim
                    : 0;
}

void launch_comp_grad_keyed(const LayerDims& d, const DeviceMetadata& meta, const bf16* q,
                            const bf16* comp, const bf16* out, const float* lse,
                            const bf16* dout, float* drow, float* dcomp_acc, float* scratch,
                            std::size_t scratch_bytes, cudaStream_t stream, KeyedKernel kernel) {
  require(comp_grad_keyed_applies(d), ErrorKind::Unsupported,
          "the key-stationary compressed-row gradient needs an HCA layer with head_dim 512");
  if (d.rows <= 0) return;
  const int chunks = comp_grad_keyed_chunks(d, kernel);
  const std::size_t needed = comp_grad_keyed_scratch_bytes(d, kernel);
  require(scratch_bytes >= needed && (chunks == 1 || scratch != nullptr), ErrorKind::InvalidArgument,
          "the key-stationary compressed-row gradient needs " + std::to_string(needed) +
              " bytes of scratch, got " + std::to_string(scratch_bytes));
  const long head_rows = static_cast<long>(d.rows) * d.heads;
  row_dot_kernel<<<static_cast<unsigned>(std::min<long>((head_rows + 7) / 8, 1l << 20)), 256, 0,
                   stream>>>(out, dout, head_rows, drow);
  CSATTN_CUDA_LAUNCH_CHECK();

  const int key_blocks = key_blocks_of(d, kernel);
  const int chunk_rows = (d.rows + chunks - 1) / chunks;
  const int head_blocks = (d.heads + kRows - 1) / kRows;
  float* partials = chunks > 1 ? scratch : dcomp_acc;
  // Every chunk's CTAs run (a chunk past the rows writes its zeros): sum_chunks reads them all.
  const long blocks = static_cast<long>(key_blocks) * chunks;
  require(blocks < (1l << 31), ErrorKind::Unsupported, "too many compressed rows for one launch");
  if (on_wgmma(kernel)) {
    launch_comp_grad_keyed_wgmma_kernel(d, meta, q, comp, lse, drow, dout, partials, blocks, key_blocks,
                                        chunk_rows, head_blocks, stream);
  } else {
    allow_dynamic_smem(comp_grad_keyed_kernel, Smem::bytes,
                       "the key-stationary compressed-row gradient");
    comp_grad_keyed_kernel<<<static_cast<unsigned>(blocks), kThreads, Smem::bytes, stream>>>(
        d, meta, q, comp, lse, drow, dout, partials, key_blocks, chunk_rows, head_blocks);
    CSATTN_CUDA_LAUNCH_CHECK();
  }
  if (chunks > 1) {
    const long total4 = static_cast<long>(d.comp_capacity) * (kDim / 4);
    sum_chunks_kernel<<<static_cast<unsigned>(std::min<long>((total4 + 255) / 256, 4096)), 256, 0,
                        stream>>>(partials, chunks, static_cast<long>(d.comp_capacity) * kDim,
                                  meta.comp_start, d.segments, dcomp_acc);
    CSATTN_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace csattn::cuda
