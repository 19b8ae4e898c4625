// Sparse attention with a per-head sink over one shared K=V head: the keys of a query are
// its window plus compressed rows (HCA: all visible; CSA: the top-k selection).
//
// This first kernel is the correctness baseline: one block per (query row, head), CUDA-core
// dot products, keys read from L2. launch_sparse_attention dispatches head_dim 512 to the
// tensor-core kernels (sparse_attention_wgmma.cu, sparse_attention_mma.cu); docs/perf.md
// measures them.
#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/check.hpp"
#include "cuda/device_util.cuh"
#include "cuda/attention_keys.cuh"
#include "cuda/kernels.hpp"
#include "cuda/kernel_switch.hpp"

namespace csattn::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxDimPerThread = 8;  // head_dim <= 1024


__global__ void __launch_bounds__(kThreads)
    sparse_attention_kernel(LayerDims d, DeviceMetadata meta, const bf16* q, const bf16* kv,
                            const bf16* comp, const float* sink, const std::int32_t* topk,
                            bf16* out, float* lse) {
  extern __shared__ unsigned char smem[];
  const int D = d.head_dim, H = d.heads;
  const int t = blockIdx.x / H, h = blockIdx.x % H;
  const int max_keys = max_keys_per_query(d);
  float* qs = reinterpret_cast<float*>(smem);  // [D]
  float* p = qs + D;                           // [max_keys]
  int* ids = reinterpret_cast<int*>(p + max_keys);  // [max_keys]
  __shared__ float scratch[32];
  __shared__ int n_comp_shared;

  const int n = build_key_list(d, meta, topk, t, ids, &n_comp_shared);
  const bf16* qrow = q + (static_cast<long>(t) * H + h) * D;
  for (int i = threadIdx.x; i < D; i += kThreads) qs[i] = __bfloat162float(qrow[i]);
  __syncthreads();

  // Logits: one warp per key.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int k = warp; k < n; k += kWarps) {
    const bf16* key = key_row_ptr(ids[k], kv, comp, D);
    float part = 0.0f;
    for (int i = lane; i < D; i += 32) part += qs[i] * __bfloat162float(key[i]);
    part = warp_sum(part);
    if (lane == 0) p[k] = part * d.scale;
  }
  __syncthreads();

  // Softmax with the sink as a zero-value logit.
  const float sigma = sink[h];
  float mx = sigma;
  for (int k = threadIdx.x; k < n; k += kThreads) mx = fmaxf(mx, p[k]);
  mx = block_max(mx, scratch);
  float z = 0.0f;
  for (int k = threadIdx.x; k < n; k += kThreads) z += expf(p[k] - mx);
  z = block_sum(z, scratch) + expf(sigma - mx);
  const float inv = 1.0f / z;
  for (int k = threadIdx.x; k < n; k += kThreads) p[k] = expf(p[k] - mx) * inv;
  __syncthreads();

  // Output: each thread owns a few dims and walks the keys (coalesced row reads).
  float acc[kMaxDimPerThread];
#pragma unroll
  for (int r = 0; r < kMaxDimPerThread; ++r) acc[r] = 0.0f;
  for (int k = 0; k < n; ++k) {
    const bf16* v = key_row_ptr(ids[k], kv, comp, D);
    const float pk = p[k];
#pragma unroll
    for (int r = 0; r < kMaxDimPerThread; ++r) {
      const int i = threadIdx.x + r * kThreads;
      if (i < D) acc[r] += pk * __bfloat162float(v[i]);
    }
  }
  bf16* orow = out + (static_cast<long>(t) * H + h) * D;
#pragma unroll
  for (int r = 0; r < kMaxDimPerThread; ++r) {
    const int i = threadIdx.x + r * kThreads;
    if (i < D) orow[i] = __float2bfloat16_rn(acc[r]);
  }
  if (threadIdx.x == 0) lse[static_cast<long>(t) * H + h] = mx + logf(z);
}

}  // namespace

void launch_sparse_attention(const LayerDims& d, const DeviceMetadata& meta, const bf16* q,
                             const bf16* kv, const bf16* comp, const float* sink,
                             const std::int32_t* topk, bf16* out, float* lse,
                             cudaStream_t stream) {
  if (d.rows <= 0) return;
  // head_dim 512 (every DeepSeek-V4 preset) takes the wgmma kernel (the mma kernel where the
  // wgmma one does not fit); CSATTN_ATTENTION=mma or =baseline forces the older kernels
  // (benchmarks, bisecting).
  enum class Choice { wgmma, mma, baseline };
  static const Choice choice = [] {
    const std::string s = kernel_switch("CSATTN_ATTENTION", {"mma", "baseline"});
    return s == "baseline" ? Choice::baseline : s == "mma" ? Choice::mma : Choice::wgmma;
  }();
  // The wgmma kernel stores O through a TMA map, whose base must be 16-byte aligned; an
  // output view at another offset takes the mma kernel.
  const bool out_aligned = reinterpret_cast<std::uintptr_t>(out) % 16 == 0;
  if (choice == Choice::wgmma && out_aligned && sparse_attention_wgmma_supported(d)) {
    launch_sparse_attention_wgmma(d, meta, q, kv, comp, sink, topk, out, lse, stream);
    return;
  }
  if (choice != Choice::baseline && sparse_attention_mma_supported(d)) {
    launch_sparse_attention_mma(d, meta, q, kv, comp, sink, topk, out, lse, stream);
    return;
  }
  launch_sparse_attention_baseline(d, meta, q, kv, comp, sink, topk, out, lse, stream);
}

void launch_sparse_attention_baseline(const LayerDims& d, const DeviceMetadata& meta,
                                      const bf16* q, const bf16* kv, const bf16* comp,
                                      const float* sink, const std::int32_t* topk, bf16* out,
                                      float* lse, cudaStream_t stream) {
  if (d.rows <= 0) return;
  require(d.head_dim <= kThreads * kMaxDimPerThread, ErrorKind::Unsupported,
          "the CUDA attention kernel supports head_dim up to 1024, got " +
              std::to_string(d.head_dim));
  const int max_keys = max_keys_per_query(d);
  const std::size_t smem = sizeof(float) * (d.head_dim + max_keys) + sizeof(int) * max_keys;
  require(smem <= 220 * 1024, ErrorKind::Unsupported,
          "the CUDA attention kernel needs " + std::to_string(smem) +
              " bytes of shared memory for " + std::to_string(max_keys) + " keys per query");
  allow_dynamic_smem(sparse_attention_kernel, smem, "the CUDA attention kernel");
  const long blocks = static_cast<long>(d.rows) * d.heads;
  sparse_attention_kernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(
      d, meta, q, kv, comp, sink, topk, out, lse);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
