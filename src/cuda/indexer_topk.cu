// The lightning indexer on the GPU: the head weights, the dispatch between the indexer
// kernels, and the two one-row kernels kept as references (CSATTN_INDEXER=baseline: CUDA
// cores; CSATTN_INDEXER=mma1: tensor cores). A one-row kernel scores one query row against the
// visible compressed keys of its segment (kept in shared memory, so its segments are limited
// to about 160K tokens), then a radix select of the k-th largest score and a deterministic
// selection (ties to the smallest index), written in ascending index order then -1. The
// default is the wgmma kernel (indexer_topk_wgmma.cu; its mma.sync reference is
// indexer_topk_tiled.cu): several rows per CTA, scores in a bounded global scratch, any length.
#include <cmath>
#include <string>

#include "cuda/check.hpp"
#include "cuda/device_util.cuh"
#include "cuda/indexer_score.cuh"
#include "cuda/indexer_topk_plan.hpp"
#include "cuda/indexer_topk_tiled.hpp"
#include "cuda/kernels.hpp"
#include "cuda/mma_util.cuh"
#include "cuda/kernel_switch.hpp"

namespace csattn::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__global__ void indexer_weights_kernel(int n, float head_scale, float dim_scale,
                                       const bf16* w_raw, float* w_eff) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  w_eff[i] = round_bf16(round_bf16(__bfloat162float(w_raw[i]) * head_scale) * dim_scale);
}

// Exclusive prefix of per-thread counts over the block (fixed thread order).
__device__ int block_exclusive_scan(int v, int* scratch) {
  __syncthreads();
  scratch[threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    int acc = 0;
    for (int i = 0; i < kThreads; ++i) {
      const int x = scratch[i];
      scratch[i] = acc;
      acc += x;
    }
  }
  __syncthreads();
  return scratch[threadIdx.x];
}

// Picks the top K of scores[0..n) (n > K) and writes their ids in ascending order to out:
// a radix select, 8 bits at a time from the top, finds the key of the K-th largest score and
// how many entries equal to it to take; ties go to the smallest ids.
__device__ void select_topk(const float* scores, int n, int K, std::int32_t* out) {
  __shared__ unsigned hist[256];
  __shared__ int scan_scratch[kThreads];
  __shared__ unsigned sel_prefix;
  __shared__ int sel_need;
  if (threadIdx.x == 0) {
    sel_prefix = 0u;
    sel_need = K;
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kThreads) hist[i] = 0u;
    __syncthreads();
    const unsigned prefix = sel_prefix;
    const unsigned high_mask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
    for (int j = threadIdx.x; j < n; j += kThreads) {
      const unsigned key = order_key(scores[j]);
      if ((key & high_mask) == (prefix & high_mask)) atomicAdd(&hist[(key >> shift) & 0xffu], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int need = sel_need;
      int bin = 255;
      for (; bin > 0; --bin) {
        const int c = static_cast<int>(hist[bin]);
        if (c >= need) break;
        need -= c;
      }
      sel_prefix = prefix | (static_cast<unsigned>(bin) << shift);
      sel_need = need;
    }
    __syncthreads();
  }
  const unsigned threshold = sel_prefix;
  const int need_equal = sel_need;

  // Each thread owns a contiguous chunk of candidates, so ranks follow index order.
  const int chunk = (n + kThreads - 1) / kThreads;
  const int lo = min(n, static_cast<int>(threadIdx.x) * chunk), hi = min(n, lo + chunk);
  int equal_here = 0;
  for (int j = lo; j < hi; ++j) equal_here += order_key(scores[j]) == threshold;
  const int equal_rank = block_exclusive_scan(equal_here, scan_scratch);
  int selected_here = 0;
  for (int j = lo, r = equal_rank; j < hi; ++j) {
    const unsigned key = order_key(scores[j]);
    if (key > threshold) ++selected_here;
    else if (key == threshold) selected_here += (r++ < need_equal);
  }
  int slot = block_exclusive_scan(selected_here, scan_scratch);
  for (int j = lo, r = equal_rank; j < hi; ++j) {
    const unsigned key = order_key(scores[j]);
    bool take = key > threshold;
    if (key == threshold) take = r++ < need_equal;
    if (take) out[slot++] = j;
  }
}

__device__ __forceinline__ int visible_candidates(const LayerDims& d, const DeviceMetadata& meta,
                                                  int t, int b) {
  const int seg_entries = meta.comp_start[b + 1] - meta.comp_start[b];
  return meta.row_is_padding[t] ? 0 : min((meta.row_position[t] + 1) / d.ratio, seg_entries);
}

// CUDA-core scoring (any head count and head dim up to 256).
__global__ void __launch_bounds__(kThreads)
    indexer_topk_kernel(LayerDims d, DeviceMetadata meta, const bf16* qi, const float* w_eff,
                        const bf16* keys, std::int32_t* topk) {
  extern __shared__ unsigned char smem[];
  const int HI = d.index_heads, DI = d.index_dim, K = d.topk;
  float* q = reinterpret_cast<float*>(smem);   // [HI * DI]
  float* w = q + HI * DI;                      // [HI]
  float* scores = w + HI;                      // [n_max]

  const int t = blockIdx.x;
  const int b = meta.row_segment[t];
  const int n = visible_candidates(d, meta, t, b);
  std::int32_t* out = topk + static_cast<long>(t) * K;
  if (n <= K) {  // every visible entry, in index order
    for (int k = threadIdx.x; k < K; k += kThreads) out[k] = k < n ? k : -1;
    return;
  }

  for (int i = threadIdx.x; i < HI * DI; i += kThreads)
    q[i] = __bfloat162float(qi[static_cast<long>(t) * HI * DI + i]);
  for (int i = threadIdx.x; i < HI; i += kThreads) w[i] = w_eff[static_cast<long>(t) * HI + i];
  __syncthreads();

  // One warp per candidate: lanes split the key's dims, the warp reduces each head's dot.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bf16* seg_keys = keys + static_cast<long>(meta.comp_start[b]) * DI;
  for (int j = warp; j < n; j += kWarps) {
    const bf16* key = seg_keys + static_cast<long>(j) * DI;
    float kv[8];  // DI <= 256
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      const int dd = lane + 32 * r;
      kv[r] = dd < DI ? __bfloat162float(key[dd]) : 0.0f;
    }
    float score = 0.0f;
    for (int h = 0; h < HI; ++h) {
      float part = 0.0f;
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        const int dd = lane + 32 * r;
        if (dd < DI) part += q[h * DI + dd] * kv[r];
      }
      const float dot = warp_sum(part);
      score += w[h] * fmaxf(dot, 0.0f);
    }
    if (lane == 0) scores[j] = score;
  }
  __syncthreads();
  select_topk(scores, n, K, out);
}

// Tensor-core scoring for up to 64 heads and a head dim that is a multiple of 64: the query's
// [64 heads x D_I] tile is the MMA's A, a tile of 64 keys its B; warps 0-3 take head rows
// 16w.., keys 0-31 of the tile, warps 4-7 the same rows and keys 32-63. ReLU, the head
// weight and the sum over heads follow in registers (a shuffle reduction over the rows),
// then across the four row groups in shared memory in a fixed order.
constexpr int kIdxRows = 64;
constexpr int kIdxKeys = 64;

__device__ __forceinline__ int idx_swz(int row, int chunk, int row_bytes) {
  return row * row_bytes + ((chunk ^ (row & 7)) << 4);
}

__global__ void __launch_bounds__(kThreads)
    indexer_topk_mma_kernel(LayerDims d, DeviceMetadata meta, const bf16* qi, const float* w_eff,
                            const bf16* keys, std::int32_t* topk) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int HI = d.index_heads, DI = d.index_dim, K = d.topk;
  const int row_bytes = DI * 2, chunks = DI / 8;
  unsigned char* q_s = smem;                                // [64, DI] bf16
  unsigned char* k_s = q_s + kIdxRows * row_bytes;          // 2 x [64, DI] bf16
  float* w = reinterpret_cast<float*>(k_s + 2 * kIdxKeys * row_bytes);  // [64]
  float* part = w + kIdxRows;                               // [4, 64]
  float* scores = part + 4 * kIdxKeys;                      // [n_max]

  const int t = blockIdx.x;
  const int b = meta.row_segment[t];
  const int n = visible_candidates(d, meta, t, b);
  std::int32_t* out = topk + static_cast<long>(t) * K;
  if (n <= K) {
    for (int k = threadIdx.x; k < K; k += kThreads) out[k] = k < n ? k : -1;
    return;
  }
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wr = warp & 3, half = warp >> 2, g = lane >> 2, qd = lane & 3;

  for (int i = tid; i < kIdxRows * chunks; i += kThreads) {
    const int r = i / chunks, c = i % chunks;
    if (r < HI)
      cp_async_16(smem_addr(q_s + idx_swz(r, c, row_bytes)),
                  qi + (static_cast<long>(t) * HI + r) * DI + c * 8);
    else
      *reinterpret_cast<uint4*>(q_s + idx_swz(r, c, row_bytes)) = make_uint4(0u, 0u, 0u, 0u);
  }
  for (int i = tid; i < kIdxRows; i += kThreads) w[i] = i < HI ? w_eff[static_cast<long>(t) * HI + i] : 0.0f;
  const bf16* seg_keys = keys + static_cast<long>(meta.comp_start[b]) * DI;
  auto load_tile = [&](int tile, int stage) {
    unsigned char* base = k_s + stage * kIdxKeys * row_bytes;
    for (int i = tid; i < kIdxKeys * chunks; i += kThreads) {
      const int r = i / chunks, c = i % chunks;
      const int j = min(tile * kIdxKeys + r, n - 1);  // past the end: a real row, unused
      cp_async_16(smem_addr(base + idx_swz(r, c, row_bytes)), seg_keys + static_cast<long>(j) * DI + c * 8);
    }
  };
  const int tiles = (n + kIdxKeys - 1) / kIdxKeys;
  load_tile(0, 0);
  cp_async_commit();
  for (int tile = 0; tile < tiles; ++tile) {
    if (tile + 1 < tiles) {
      load_tile(tile + 1, (tile + 1) & 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const unsigned char* kb = k_s + (tile & 1) * kIdxKeys * row_bytes;
    float s[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    for (int ks = 0; ks < DI / 16; ++ks) {
      std::uint32_t a[4];
      ldmatrix_x4(smem_addr(q_s + idx_swz(16 * wr + (lane & 15), 2 * ks + (lane >> 4), row_bytes)), a);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        std::uint32_t bk[4];
        const int key = 32 * half + 16 * nt + (lane & 7) + ((lane >> 4) << 3);
        ldmatrix_x4(smem_addr(kb + idx_swz(key, 2 * ks + ((lane >> 3) & 1), row_bytes)), bk);
        mma_bf16(s[2 * nt], a, bk[0], bk[1]);
        mma_bf16(s[2 * nt + 1], a, bk[2], bk[3]);
      }
    }
    // w[h] * ReLU(dot), summed over this warp's 16 head rows (lanes with the same q hold
    // the same key columns).
    const float w0 = w[16 * wr + g], w1 = w[16 * wr + g + 8];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float v = head_pair_term(w0, s[j][c], w1, s[j][2 + c]);
        v += __shfl_xor_sync(0xffffffffu, v, 4);
        v += __shfl_xor_sync(0xffffffffu, v, 8);
        v += __shfl_xor_sync(0xffffffffu, v, 16);
        if (g == 0) part[wr * kIdxKeys + 32 * half + 8 * j + 2 * qd + c] = v;
      }
    __syncthreads();
    for (int k = tid; k < kIdxKeys; k += kThreads) {
      const int j = tile * kIdxKeys + k;
      if (j < n) scores[j] = ((part[k] + part[kIdxKeys + k]) + part[2 * kIdxKeys + k]) + part[3 * kIdxKeys + k];
    }
    __syncthreads();  // the stage and `part` are rewritten next
  }
  select_topk(scores, n, K, out);
}

bool indexer_mma_supported(const LayerDims& d) {
  return d.index_heads <= kIdxRows && d.index_dim % 64 == 0 && d.index_dim <= 256;
}

std::size_t indexer_topk_smem_bytes(const LayerDims& d, bool mma) {
  const std::size_t n_max = static_cast<std::size_t>(d.max_seg_len / d.ratio);
  if (mma)
    return static_cast<std::size_t>(kIdxRows + 2 * kIdxKeys) * d.index_dim * 2 +
           sizeof(float) * (kIdxRows + 4 * kIdxKeys + n_max);
  return sizeof(float) * (static_cast<std::size_t>(d.index_heads) * d.index_dim + d.index_heads + n_max);
}

void launch_one_row(const LayerDims& d, const DeviceMetadata& meta, const bf16* qi,
                    const float* w_eff, const bf16* keys, std::int32_t* topk, bool mma,
                    cudaStream_t stream) {
  const std::size_t smem = indexer_topk_smem_bytes(d, mma);
  require(smem <= 220 * 1024, ErrorKind::Unsupported,
          "the one-row CUDA indexer keeps one row's scores in shared memory: max segment length " +
              std::to_string(d.max_seg_len) + " needs " + std::to_string(smem) +
              " bytes, more than 220 KiB (the tiled indexer has no such limit)");
  auto kernel = mma ? indexer_topk_mma_kernel : indexer_topk_kernel;
  allow_dynamic_smem(kernel, smem, "the CUDA indexer");
  kernel<<<d.rows, kThreads, smem, stream>>>(d, meta, qi, w_eff, keys, topk);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace

void launch_indexer_weights(const LayerDims& d, const bf16* w_raw, float* w_eff,
                            cudaStream_t stream) {
  const int n = d.rows * d.index_heads;
  if (n <= 0) return;
  const float head_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.index_heads)));
  const float dim_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.index_dim)));
  indexer_weights_kernel<<<(n + 255) / 256, 256, 0, stream>>>(n, head_scale, dim_scale, w_raw,
                                                                w_eff);
  CSATTN_CUDA_LAUNCH_CHECK();
}

IndexerKernel indexer_kernel_for(const LayerDims& d) {
  static const std::string env =
      kernel_switch("CSATTN_INDEXER", {"wgmma", "tiled", "mma1", "baseline"});
  if (env == "baseline") return IndexerKernel::baseline;
  if (env == "mma1") return indexer_mma_supported(d) ? IndexerKernel::mma1 : IndexerKernel::baseline;
  if (env == "tiled" && indexer_tiled_supported(d)) return IndexerKernel::tiled;
  if (env == "wgmma" && indexer_tiled_supported(d)) return IndexerKernel::wgmma;
  if (indexer_tiled_supported(d)) return IndexerKernel::wgmma_overlap;
  return indexer_mma_supported(d) ? IndexerKernel::mma1 : IndexerKernel::baseline;
}

void launch_indexer_topk(const LayerDims& d, const DeviceMetadata& meta, const bf16* qi,
                         const float* w_eff, const bf16* keys, std::int32_t* topk, void* scratch,
                         cudaStream_t stream, IndexerKernel which, const SelectedScores& scores) {
  if (d.rows <= 0) return;
  require(d.index_dim <= 256, ErrorKind::Unsupported,
          "the CUDA indexer supports index_head_dim up to 256, got " + std::to_string(d.index_dim));
  if (which == IndexerKernel::automatic) which = indexer_kernel_for(d);
  switch (which) {
    case IndexerKernel::wgmma:
      launch_indexer_topk_wgmma(d, meta, qi, w_eff, keys, topk, scratch, stream, nullptr, scores);
      break;
    case IndexerKernel::wgmma_overlap:
      launch_indexer_topk_wgmma_overlap(d, meta, qi, w_eff, keys, topk, scratch, stream, scores);
      break;
    case IndexerKernel::tiled:
      launch_indexer_topk_tiled(d, meta, qi, w_eff, keys, topk, scratch, stream);
      break;
    case IndexerKernel::mma1:
      require(indexer_mma_supported(d), ErrorKind::Unsupported,
              "the one-row tensor-core indexer needs index_n_heads <= 64 and index_head_dim a multiple of 64");
      launch_one_row(d, meta, qi, w_eff, keys, topk, true, stream);
      break;
    default:
      launch_one_row(d, meta, qi, w_eff, keys, topk, false, stream);
      break;
  }
}

bool indexer_writes_selected_scores(IndexerKernel k) {
  return k == IndexerKernel::wgmma || k == IndexerKernel::wgmma_overlap;
}

}  // namespace csattn::cuda
