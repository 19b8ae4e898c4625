// The lightning indexer on the GPU: scores of one query row against the visible compressed
// keys of its segment (kept in shared memory: the dense score matrix is never stored), then a
// radix select of the k-th largest score and a deterministic selection (ties to the
// smallest index), written in ascending index order then -1.
#include <cmath>

#include "cuda/check.hpp"
#include "cuda/device_util.cuh"
#include "cuda/kernels.hpp"

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

// Order-preserving map of a float to an unsigned key (larger float -> larger key); -0 is
// mapped like +0 so the two tie as they do on the host.
__device__ __forceinline__ unsigned order_key(float f) {
  unsigned u = __float_as_uint(f);
  if (u == 0x80000000u) u = 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
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

__global__ void __launch_bounds__(kThreads)
    indexer_topk_kernel(LayerDims d, DeviceMetadata meta, const bf16* qi, const float* w_eff,
                        const bf16* keys, std::int32_t* topk) {
  extern __shared__ unsigned char smem[];
  const int HI = d.index_heads, DI = d.index_dim, K = d.topk;
  float* q = reinterpret_cast<float*>(smem);   // [HI * DI]
  float* w = q + HI * DI;                      // [HI]
  float* scores = w + HI;                      // [n_max]
  __shared__ unsigned hist[256];
  __shared__ int scan_scratch[kThreads];
  __shared__ unsigned sel_prefix;
  __shared__ int sel_need;

  const int t = blockIdx.x;
  const int b = meta.row_segment[t];
  const int seg_entries = meta.comp_start[b + 1] - meta.comp_start[b];
  const int n = meta.row_is_padding[t] ? 0 : min((meta.row_position[t] + 1) / d.ratio, seg_entries);
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

  // Radix select, 8 bits at a time from the top: the key of the K-th largest score and how
  // many entries equal to it must be taken.
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
  int equal_rank = block_exclusive_scan(equal_here, scan_scratch);
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

std::size_t indexer_topk_smem_bytes(const LayerDims& d) {
  const int n_max = d.max_seg_len / d.ratio;
  return sizeof(float) * (static_cast<std::size_t>(d.index_heads) * d.index_dim + d.index_heads +
                          static_cast<std::size_t>(n_max));
}

void launch_indexer_topk(const LayerDims& d, const DeviceMetadata& meta, const bf16* qi,
                         const float* w_eff, const bf16* keys, std::int32_t* topk,
                         cudaStream_t stream) {
  if (d.rows <= 0) return;
  require(d.index_dim <= 256, ErrorKind::Unsupported,
          "the CUDA indexer supports index_head_dim up to 256, got " + std::to_string(d.index_dim));
  const std::size_t smem = indexer_topk_smem_bytes(d);
  require(smem <= 220 * 1024, ErrorKind::Unsupported,
          "the CUDA indexer keeps one row's scores in shared memory: max segment length " +
              std::to_string(d.max_seg_len) + " needs " + std::to_string(smem) +
              " bytes, more than 220 KiB (a chunked kernel is future work)");
  if (smem > 48 * 1024)
    CSATTN_CUDA_CHECK(cudaFuncSetAttribute(indexer_topk_kernel,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
  indexer_topk_kernel<<<d.rows, kThreads, smem, stream>>>(d, meta, qi, w_eff, keys, topk);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
