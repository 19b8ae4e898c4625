// Tensor-core sparse attention backward for head_dim 512 (the DeepSeek-V4 shape).
//
// One CTA per (query token, block of 64 heads); rows past H are zero and never written. The
// heads of a token share one K=V head, so each gathered key tile (32 keys x 512 dims) serves
// all 64 head rows. Per tile, with P recomputed from the forward's LSE:
//   S  = Q K^T,  P = exp(S * scale - LSE)          [64 x 32]   phase A
//   dP = dO K^T  (V = K)                           [64 x 32]   phase A
//   dS = scale * P * (dP - Drow), Drow = dO . O    [64 x 32]   phase A
//   dQ += dS K                                     [64 x 512]  phase B (registers, all tiles)
//   dK  = P^T dO + dS^T Q                          [32 x 512]  phase C (key + value terms)
// All products are m16n8k16 bf16 MMAs with fp32 accumulation; P and dS are rounded to bf16 in
// shared memory (as the forward rounds P before P V). Eight warps, split per phase:
//   A: 4 row blocks x 2 key halves, 16 rows x 16 keys over the full 512 dims (no cross-warp
//      sum), K fragments shared by S and dP;
//   B: 4 row blocks x 2 dim halves, 16 rows x 256 dims = 128 fp32 registers per thread;
//   C: 2 key blocks x 4 dim quarters, in 64-dim sub-chunks (32 registers) flushed to the key
//      gradients with vector fp32 reductions (flush_dk, the one place that writes them).
// Shared memory: Q and dO (64 KB each, swizzled), two key stages (cp.async, double-buffered,
// 64 KB), P and dS (4 KB each), per-row LSE / Drow and the key list.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "cuda/atomic_util.cuh"
#include "cuda/attention_keys.cuh"
#include "cuda/attention_mma_tiles.cuh"
#include "cuda/attention_row_terms.cuh"
#include "cuda/backward_kernels.hpp"
#include "cuda/check.hpp"
#include "cuda/device_util.cuh"
#include "cuda/mma_util.cuh"

namespace csattn::cuda {

namespace {

using mma_tiles::kChunks;
using mma_tiles::kDim;
using mma_tiles::kRowBytes;
using mma_tiles::kTileRowBytes;
using mma_tiles::pswz;
using mma_tiles::swz;
constexpr int kRows = 64;   // head rows per CTA
constexpr int kKeys = mma_tiles::kTileKeys;  // keys per tile
constexpr int kThreads = 256;
constexpr int kSubDims = 64;            // dK sub-chunk per warp (registers: 32 fp32)
constexpr float kLog2e = 1.4426950408889634f;

struct Smem {  // byte offsets into the dynamic shared memory
  static constexpr int q = 0;
  static constexpr int dout = q + kRows * kRowBytes;
  static constexpr int keys = dout + kRows * kRowBytes;
  static constexpr int p = keys + 2 * kKeys * kRowBytes;
  static constexpr int ds = p + kRows * kTileRowBytes;
  static constexpr int lse2 = ds + kRows * kTileRowBytes;  // LSE * log2(e), +inf past H
  static constexpr int drow = lse2 + kRows * 4;
  static constexpr int ids = drow + kRows * 4;
};

std::size_t mma_smem_bytes(int max_keys) {
  return static_cast<std::size_t>(Smem::ids) + sizeof(int) * static_cast<std::size_t>(max_keys);
}

// Where the key gradients of a CTA go.
struct DkTarget {
  float* dkv_acc;    // [T, 512] raw kv rows (ids >= 0)
  float* dcomp_acc;  // [Nc, 512] compressed rows (ids < 0)
  const int* ids;    // the query's key list (shared memory)
  int n;             // the slots written: its length (or, GradChunk::window_only, the window's)
};

// The one writer of key gradients. Adds one warp's slice of the dK tile of query `query`,
// head block `head_block`: keys slot0 + key0 + {g, g + 8} of the key list (g = lane / 4),
// dims dim0 + 8 j + {2q, 2q + 1} for j < 8 (q = lane % 4), i.e. acc[j] is the m16n8 C fragment
// of dims dim0 + 8 j. Slots past the list's end (the last tile's tail) are skipped.
// Atomic path: lane pairs (q, q ^ 1) swap halves so each lane holds 4 consecutive dims of one
// key, then one red.global.add.v4.f32 per n8 tile. Deterministic mode (chunk.scratch): the same four values are stored to this CTA's own
// scratch row (query, head block, slot) instead.
template <bool kScratch>
__device__ __forceinline__ void flush_dk(const DkTarget& tgt, int query, int head_block,
                                         int slot0, int key0, int dim0, float (&acc)[8][4],
                                         float* scratch) {
  const int lane = threadIdx.x & 31, g = lane >> 2, qd = lane & 3;
  const bool odd = qd & 1;
  const int slot = slot0 + key0 + g + (odd ? 8 : 0);
  const bool live = slot < tgt.n;
  const int id = live ? tgt.ids[slot] : 0;
  (void)query;
  (void)head_block;
  float* row = kScratch ? scratch + static_cast<long>(slot) * kDim
                        : key_grad_row(id, tgt.dkv_acc, tgt.dcomp_acc, kDim);
  const int col = dim0 + 2 * (qd & ~1);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    // Even lanes keep row g (c0, c1) and receive the odd partner's row g; odd lanes keep row
    // g + 8 (c2, c3) and receive the even partner's row g + 8.
    const float s0 = odd ? acc[j][0] : acc[j][2];
    const float s1 = odd ? acc[j][1] : acc[j][3];
    const float r0 = __shfl_xor_sync(0xffffffffu, s0, 1);
    const float r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
    if (!live) continue;
    if (kScratch) {  // this CTA's own row: a plain store
      *reinterpret_cast<float4*>(row + col + 8 * j) = odd ? make_float4(r0, r1, acc[j][2], acc[j][3])
                                                           : make_float4(acc[j][0], acc[j][1], r0, r1);
    } else if (odd) {
      red_add_v4(row + col + 8 * j, r0, r1, acc[j][2], acc[j][3]);
    } else {
      red_add_v4(row + col + 8 * j, acc[j][0], acc[j][1], r0, r1);
    }
  }
}

template <bool kScratch>  // deterministic mode: key gradients to the chunk's scratch
__global__ void __launch_bounds__(kThreads, 1)
    attention_backward_mma_kernel(LayerDims d, DeviceMetadata meta, const bf16* q,
                                  const bf16* kv, const bf16* comp, const float* sink,
                                  const std::int32_t* topk, OutputRows out, const float* lse,
                                  const bf16* dout, bf16* dq_out, float* dkv_acc,
                                  float* dcomp_acc, float* dsink_part, int head_blocks,
                                  GradChunk chunk) {
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* q_s = smem + Smem::q;
  unsigned char* do_s = smem + Smem::dout;
  unsigned char* k_s = smem + Smem::keys;
  unsigned char* p_s = smem + Smem::p;
  unsigned char* ds_s = smem + Smem::ds;
  float* lse2_s = reinterpret_cast<float*>(smem + Smem::lse2);
  float* drow_s = reinterpret_cast<float*>(smem + Smem::drow);
  int* ids = reinterpret_cast<int*>(smem + Smem::ids);
  __shared__ int count_shared;

  const int H = d.heads;
  const int hb = blockIdx.x % head_blocks;
  // The atomic path always covers every row (r0 = 0, checked by the launcher): one register
  // less in a kernel at the 255 limit.
  const int t = (kScratch ? chunk.r0 : 0) + static_cast<int>(blockIdx.x / head_blocks), h0 = hb * kRows;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, qd = lane & 3;

  const int n = build_key_list(d, meta, topk, t, ids, &count_shared);
  const int tiles = (n + kKeys - 1) / kKeys;

  // Q and dO rows h0..h0+63 (rows past H are zero).
  for (int i = tid; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    if (h0 + r < H) {
      const long off = (static_cast<long>(t) * H + h0 + r) * kDim + c * 8;
      cp_async_16(smem_addr(q_s + swz(r, c)), q + off);
      cp_async_16(smem_addr(do_s + swz(r, c)), dout + off);
    } else {
      *reinterpret_cast<uint4*>(q_s + swz(r, c)) = make_uint4(0u, 0u, 0u, 0u);
      *reinterpret_cast<uint4*>(do_s + swz(r, c)) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
  auto load_tile = [&](int tile, int stage) {
    unsigned char* base = k_s + stage * kKeys * kRowBytes;
    for (int i = tid; i < kKeys * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i % kChunks;
      const int slot = tile * kKeys + r;
      const int id = ids[slot < n ? slot : 0];  // past the end: a real row, P = 0 there
      cp_async_16(smem_addr(base + swz(r, c)), key_row_ptr(id, kv, comp, kDim) + c * 8);
    }
  };
  if (tiles > 0) load_tile(0, 0);
  cp_async_commit();

  attention_row_terms<kThreads / 32, kDim>(H, t, h0, out, dout, lse, sink, dsink_part, drow_s, lse2_s);

  const float scale2 = d.scale * kLog2e;
  const int wr = warp & 3;          // phases A, B: row block 16 wr
  const int kh = warp >> 2;         // phase A: key half 16 kh
  const int dh = warp >> 2;         // phase B: dim half 256 dh
  const int kb = warp & 1;          // phase C: key block 16 kb
  const int dq4 = warp >> 1;        // phase C: dim quarter 128 dq4
  float* scratch = nullptr;
  if (kScratch)  // rows (query, head block, slot) of the chunk's scratch
    scratch = chunk.scratch + static_cast<long>((t - chunk.r0) * chunk.copies + hb) * chunk.slots * kDim;
  // The slots whose dK leave the CTA: all, or (GradChunk::window_only) the window's.
  const int flush_n = kScratch && chunk.window_only
                          ? query_window(d, meta, meta.row_segment[t], meta.row_position[t]).n
                          : n;
  const DkTarget target{dkv_acc, dcomp_acc, ids, flush_n};

  float dq[32][4];
#pragma unroll
  for (int j = 0; j < 32; ++j) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.0f;

  for (int tile = 0; tile < tiles; ++tile) {
    cp_async_wait<0>();  // this tile (and, on the first, Q and dO) landed
    // Visible to every warp; every warp is done with the previous tile (its key stage, P, dS).
    __syncthreads();
    if (tile + 1 < tiles) load_tile(tile + 1, (tile + 1) & 1);
    cp_async_commit();
    const unsigned char* kt = k_s + (tile & 1) * kKeys * kRowBytes;

    // Phase A: S and dP for rows 16 wr.., keys 16 kh.. over all 512 dims; one K fragment
    // serves both products.
    {
      float s[2][4], dp[2][4];
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[j][i] = dp[j][i] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < kDim / 16; ++ks) {
        const int chunk0 = ks * 2;
        std::uint32_t aq[4], ao[4], bk[4];
        const int arow = 16 * wr + (lane & 15), achunk = chunk0 + (lane >> 4);
        ldmatrix_x4(smem_addr(q_s + swz(arow, achunk)), aq);
        ldmatrix_x4(smem_addr(do_s + swz(arow, achunk)), ao);
        const int key = 16 * kh + (lane & 7) + ((lane >> 4) << 3);
        ldmatrix_x4(smem_addr(kt + swz(key, chunk0 + ((lane >> 3) & 1))), bk);
        mma_bf16(s[0], aq, bk[0], bk[1]);
        mma_bf16(s[1], aq, bk[2], bk[3]);
        mma_bf16(dp[0], ao, bk[0], bk[1]);
        mma_bf16(dp[1], ao, bk[2], bk[3]);
      }
      // P and scale * dS as bf16 into the [64 x 32] tiles; slots past the list are 0.
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = 16 * wr + g + 8 * half;
        const float l2 = lse2_s[row], dr = drow_s[row];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int key = 16 * kh + 8 * j + 2 * qd;
          float pv[2], dv[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const bool valid = tile * kKeys + key + e < n;
            pv[e] = valid ? exp2f(s[j][2 * half + e] * scale2 - l2) : 0.0f;
            dv[e] = d.scale * pv[e] * (dp[j][2 * half + e] - dr);
          }
          const int off = pswz(row, key >> 3) + (key & 7) * 2;
          *reinterpret_cast<std::uint32_t*>(p_s + off) = pack_bf16(pv[0], pv[1]);
          *reinterpret_cast<std::uint32_t*>(ds_s + off) = pack_bf16(dv[0], dv[1]);
        }
      }
    }
    __syncthreads();  // P and dS complete

    // Phase B: dQ (rows 16 wr.., dims 256 dh..) += dS K over the tile's 32 keys.
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      std::uint32_t a[4];
      ldmatrix_x4(smem_addr(ds_s + pswz(16 * wr + (lane & 15), 2 * kk + (lane >> 4))), a);
      const int key = 16 * kk + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
      for (int np = 0; np < 16; ++np) {
        const int chunk = (dh * 256 + np * 16) / 8 + (lane >> 4);
        std::uint32_t bv[4];
        ldmatrix_x4_trans(smem_addr(kt + swz(key, chunk)), bv);
        mma_bf16(dq[2 * np], a, bv[0], bv[1]);
        mma_bf16(dq[2 * np + 1], a, bv[2], bv[3]);
      }
    }

    // Phase C: dK (keys 16 kb.., dims 128 dq4..) = P^T dO + dS^T Q over the 64 head rows, in
    // 64-dim sub-chunks. A = P^T / dS^T by transposed ldmatrix from the [head][key] tiles:
    // matrix m of the x4 holds heads +8 (m >> 1) and keys +8 (m & 1). Skipped for a tile
    // with no slot written (GradChunk::window_only: compressed tiles; uniform per CTA).
    if (tile * kKeys < flush_n) {
      const int m = lane >> 3;
      const int a_head = (lane & 7) + ((m >> 1) << 3), a_chunk = 2 * kb + (m & 1);
      const int b_head = (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
      for (int sc = 0; sc < 128 / kSubDims; ++sc) {
        const int dim0 = dq4 * 128 + sc * kSubDims;
        float acc[8][4];
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < kRows / 16; ++ks) {
          std::uint32_t ap[4], ad[4];
          ldmatrix_x4_trans(smem_addr(p_s + pswz(16 * ks + a_head, a_chunk)), ap);
          ldmatrix_x4_trans(smem_addr(ds_s + pswz(16 * ks + a_head, a_chunk)), ad);
#pragma unroll
          for (int np = 0; np < kSubDims / 16; ++np) {
            const int chunk = (dim0 + np * 16) / 8 + (lane >> 4);
            std::uint32_t bo[4], bq[4];
            ldmatrix_x4_trans(smem_addr(do_s + swz(16 * ks + b_head, chunk)), bo);
            ldmatrix_x4_trans(smem_addr(q_s + swz(16 * ks + b_head, chunk)), bq);
            mma_bf16(acc[2 * np], ap, bo[0], bo[1]);
            mma_bf16(acc[2 * np + 1], ap, bo[2], bo[3]);
            mma_bf16(acc[2 * np], ad, bq[0], bq[1]);
            mma_bf16(acc[2 * np + 1], ad, bq[2], bq[3]);
          }
        }
        flush_dk<kScratch>(target, t, hb, tile * kKeys, 16 * kb, dim0, acc, scratch);
      }
    }
  }
  cp_async_wait<0>();

  // dQ in bf16 (this CTA holds the whole sum); rows past H are never written.
  const int row0 = 16 * wr + g, row1 = row0 + 8;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int dim = dh * 256 + j * 8 + 2 * qd;
    if (h0 + row0 < H)
      *reinterpret_cast<__nv_bfloat162*>(dq_out + (static_cast<long>(t) * H + h0 + row0) * kDim + dim) =
          __floats2bfloat162_rn(dq[j][0], dq[j][1]);
    if (h0 + row1 < H)
      *reinterpret_cast<__nv_bfloat162*>(dq_out + (static_cast<long>(t) * H + h0 + row1) * kDim + dim) =
          __floats2bfloat162_rn(dq[j][2], dq[j][3]);
  }
}

}  // namespace

// Longer key lists than the shared memory holds (HCA segments of ~850K tokens) take the
// baseline; both instances must fit.
bool attention_backward_mma_supported(const LayerDims& d) {
  return d.head_dim == kDim &&
         mma_smem_bytes(max_keys_per_query(d)) <=
             std::min(dynamic_smem_limit(attention_backward_mma_kernel<false>),
                      dynamic_smem_limit(attention_backward_mma_kernel<true>));
}

void launch_attention_backward_mma(const LayerDims& d, const DeviceMetadata& meta, const bf16* q,
                                   const bf16* kv, const bf16* comp, const float* sink,
                                   const std::int32_t* topk, OutputRows out, const float* lse,
                                   const bf16* dout, bf16* dq_out, float* dkv_acc,
                                   float* dcomp_acc, float* dsink_part, cudaStream_t stream,
                                   const GradChunk& chunk) {
  check_output_rows(d, out);
  const int rows = chunk.launch_rows(d.rows);
  if (rows <= 0) return;
  require(chunk.scratch != nullptr || chunk.r0 == 0, ErrorKind::InvalidArgument,
          "the tensor-core attention backward runs row chunks only with a scratch");
  require(d.head_dim == kDim, ErrorKind::Unsupported,
          "the tensor-core attention backward needs head_dim 512, got " +
              std::to_string(d.head_dim));
  const std::size_t smem = mma_smem_bytes(max_keys_per_query(d));
  auto kernel = chunk.scratch ? attention_backward_mma_kernel<true> : attention_backward_mma_kernel<false>;
  allow_dynamic_smem(kernel, smem,
                     "the tensor-core attention backward (its shared memory grows with the keys per query)");
  const int head_blocks = (d.heads + kRows - 1) / kRows;
  const long blocks = static_cast<long>(rows) * head_blocks;
  kernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(
      d, meta, q, kv, comp, sink, topk, out, lse, dout, dq_out, dkv_acc, dcomp_acc, dsink_part,
      head_blocks, chunk);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
