// Tensor-core sparse attention for head_dim 512 (the DeepSeek-V4 shape).
//
// One CTA per (query token, block of 64 heads). The heads of a token share one K=V head, so
// each gathered key tile (32 keys x 512 dims, swizzled in shared memory) serves all 64 head
// rows: S = Q K^T and O += P V are m16n8k16 bf16 MMAs with fp32 accumulation. Eight warps:
// warps 0-3 own head rows 16w..16w+15 and output dims [0, 256), warps 4-7 the same rows and
// dims [256, 512). Each warp computes S over its half of the 512 dims; the halves are summed
// through shared memory so both warps of a row hold the same S and the same softmax state.
// Key tiles are gathered with cp.async, double-buffered. The sink enters the online softmax
// as the initial running max (a zero-value logit). LSE is natural-log, sink included.
#include <cmath>

#include "cuda/check.hpp"
#include "cuda/device_util.cuh"
#include "cuda/attention_keys.cuh"
#include "cuda/kernels.hpp"
#include "cuda/mma_util.cuh"

namespace csattn::cuda {

namespace {

constexpr int kDim = 512;
constexpr int kRows = 64;   // head rows per CTA
constexpr int kKeys = 32;   // keys per tile
constexpr int kThreads = 256;
constexpr int kRowBytes = kDim * 2;
constexpr int kChunks = kDim / 8;  // 16-byte chunks per row
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled [rows, 512] bf16 tile: the
// XOR spreads the 8 rows an ldmatrix reads at one logical chunk over 8 distinct bank groups.
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * kRowBytes + ((chunk ^ (row & 7)) << 4);
}

std::size_t mma_smem_bytes(int max_keys) {
  return static_cast<std::size_t>(kRows) * kRowBytes + 2ull * kKeys * kRowBytes +
         8ull * 16 * kKeys * sizeof(float) + sizeof(int) * static_cast<std::size_t>(max_keys);
}

__global__ void __launch_bounds__(kThreads, 1)
    sparse_attention_mma_kernel(LayerDims d, DeviceMetadata meta, const bf16* q, const bf16* kv,
                                const bf16* comp, const float* sink, const std::int32_t* topk,
                                bf16* out, float* lse, int head_blocks) {
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* q_s = smem;
  unsigned char* k_s = q_s + kRows * kRowBytes;
  float* s_x = reinterpret_cast<float*>(k_s + 2 * kKeys * kRowBytes);
  int* ids = reinterpret_cast<int*>(s_x + 8 * 16 * kKeys);
  __shared__ int n_comp_shared;  // the key count

  const int H = d.heads;
  const int t = blockIdx.x / head_blocks, h0 = (blockIdx.x % head_blocks) * kRows;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int grp = warp >> 2, wr = warp & 3;
  const int g = lane >> 2, qd = lane & 3;

  const int n = build_key_list(d, meta, topk, t, ids, &n_comp_shared);
  const int tiles = (n + kKeys - 1) / kKeys;

  // Q rows h0..h0+63 (rows past H are zero and never written back).
  for (int i = tid; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    if (h0 + r < H)
      cp_async_16(smem_addr(q_s + swz(r, c)), q + (static_cast<long>(t) * H + h0 + r) * kDim + c * 8);
    else
      *reinterpret_cast<uint4*>(q_s + swz(r, c)) = make_uint4(0u, 0u, 0u, 0u);
  }
  auto load_tile = [&](int tile, int stage) {
    unsigned char* base = k_s + stage * kKeys * kRowBytes;
    for (int i = tid; i < kKeys * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i % kChunks;
      const int slot = tile * kKeys + r;
      const int id = ids[slot < n ? slot : 0];  // past the end: a real row, masked below
      const bf16* row = key_row_ptr(id, kv, comp, kDim);
      cp_async_16(smem_addr(base + swz(r, c)), row + c * 8);
    }
  };
  load_tile(0, 0);
  cp_async_commit();

  const int row0 = 16 * wr + g, row1 = row0 + 8;
  const float scale2 = d.scale * kLog2e;
  float m_run[2] = {(h0 + row0 < H ? sink[h0 + row0] : 0.0f) * kLog2e,
                    (h0 + row1 < H ? sink[h0 + row1] : 0.0f) * kLog2e};
  float l_run[2] = {1.0f, 1.0f};  // the sink's exp(sigma - m) with m = sigma
  float o[32][4];
#pragma unroll
  for (int j = 0; j < 32; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

  for (int tile = 0; tile < tiles; ++tile) {
    if (tile + 1 < tiles) {
      load_tile(tile + 1, (tile + 1) & 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const unsigned char* kb = k_s + (tile & 1) * kKeys * kRowBytes;

    // Partial S over this warp group's 256 dims: 16 rows x 32 keys.
    float s[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < 16; ++ks) {
      const int chunk0 = (grp * 256 + ks * 16) >> 3;
      std::uint32_t a[4];
      ldmatrix_x4(smem_addr(q_s + swz(16 * wr + (lane & 15), chunk0 + (lane >> 4))), a);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        std::uint32_t bk[4];
        const int key = 16 * nt + (lane & 7) + ((lane >> 4) << 3);
        ldmatrix_x4(smem_addr(kb + swz(key, chunk0 + ((lane >> 3) & 1))), bk);
        mma_bf16(s[2 * nt], a, bk[0], bk[1]);
        mma_bf16(s[2 * nt + 1], a, bk[2], bk[3]);
      }
    }
    // Sum the two halves: a + b is exact-commutative, so both warps get identical S.
    float* mine = s_x + warp * (16 * kKeys);
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) mine[(j * 4 + i) * 32 + lane] = s[j][i];
    __syncthreads();
    const float* other = s_x + (warp ^ 4) * (16 * kKeys);
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[j][i] += other[(j * 4 + i) * 32 + lane];

    // Online softmax in the log2 domain; slots past the key list are -inf.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = tile * kKeys + j * 8 + 2 * qd + (i & 1);
        s[j][i] = key < n ? s[j][i] * scale2 : -INFINITY;
        mx[i >> 1] = fmaxf(mx[i >> 1], s[j][i]);
      }
    float corr[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m_run[r], mx[r]);
      corr[r] = exp2f(m_run[r] - m_new);
      m_run[r] = m_new;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[j][i] = exp2f(s[j][i] - m_run[i >> 1]);
        sum[i >> 1] += s[j][i];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
      l_run[r] = l_run[r] * corr[r] + sum[r];
    }
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      o[j][0] *= corr[0];
      o[j][1] *= corr[0];
      o[j][2] *= corr[1];
      o[j][3] *= corr[1];
    }
    // P as A fragments (two k16 steps over the 32 keys), then O += P V on this half's dims.
    std::uint32_t pa[2][4];
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      pa[kk][0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
      pa[kk][1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
      pa[kk][2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[kk][3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      const int key = 16 * kk + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
      for (int np = 0; np < 16; ++np) {
        const int chunk = (grp * 256 + np * 16) / 8 + (lane >> 4);
        std::uint32_t bv[4];
        ldmatrix_x4_trans(smem_addr(kb + swz(key, chunk)), bv);
        mma_bf16(o[2 * np], pa[kk], bv[0], bv[1]);
        mma_bf16(o[2 * np + 1], pa[kk], bv[2], bv[3]);
      }
    }
    __syncthreads();  // the stage and the exchange buffer are rewritten next
  }

  const float inv0 = 1.0f / l_run[0], inv1 = 1.0f / l_run[1];
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int dim = grp * 256 + j * 8 + 2 * qd;
    if (h0 + row0 < H)
      *reinterpret_cast<__nv_bfloat162*>(out + (static_cast<long>(t) * H + h0 + row0) * kDim + dim) =
          __floats2bfloat162_rn(o[j][0] * inv0, o[j][1] * inv0);
    if (h0 + row1 < H)
      *reinterpret_cast<__nv_bfloat162*>(out + (static_cast<long>(t) * H + h0 + row1) * kDim + dim) =
          __floats2bfloat162_rn(o[j][2] * inv1, o[j][3] * inv1);
  }
  if (grp == 0 && qd == 0) {
    if (h0 + row0 < H) lse[static_cast<long>(t) * H + h0 + row0] = (m_run[0] + log2f(l_run[0])) * kLn2;
    if (h0 + row1 < H) lse[static_cast<long>(t) * H + h0 + row1] = (m_run[1] + log2f(l_run[1])) * kLn2;
  }
}

}  // namespace

bool sparse_attention_mma_supported(const LayerDims& d) {
  return d.head_dim == kDim &&
         mma_smem_bytes(max_keys_per_query(d)) <= dynamic_smem_limit(sparse_attention_mma_kernel);
}

void launch_sparse_attention_mma(const LayerDims& d, const DeviceMetadata& meta, const bf16* q,
                                 const bf16* kv, const bf16* comp, const float* sink,
                                 const std::int32_t* topk, bf16* out, float* lse,
                                 cudaStream_t stream) {
  if (d.rows <= 0) return;
  const std::size_t smem = mma_smem_bytes(max_keys_per_query(d));
  allow_dynamic_smem(sparse_attention_mma_kernel, smem,
                     "the tensor-core attention kernel (its shared memory grows with the keys per query)");
  const int head_blocks = (d.heads + kRows - 1) / kRows;
  const long blocks = static_cast<long>(d.rows) * head_blocks;
  sparse_attention_mma_kernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(
      d, meta, q, kv, comp, sink, topk, out, lse, head_blocks);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
