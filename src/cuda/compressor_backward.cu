// Compressor pooling backward: one thread per (compressed row, channel) recomputes the
// softmax over its candidates; each (token, column) of the projections feeds exactly one
// entry, so da / dg are written without conflicts. The ape gradient is a fixed-order sum
// over entries of the score gradients of each slot: a block per 32 (slot, column) pairs, its
// 16 warps taking every 16th entry in order, then the warps in order (one thread a pair over
// every entry left the GPU idle: 1024 threads for the indexer compressor's, over Nc entries).
#include "cuda/backward_kernels.hpp"
#include "cuda/check.hpp"
#include "cuda/device_util.cuh"

namespace csattn::cuda {

namespace {

__global__ void pool_backward_kernel(int capacity, CompEntries entries, int d, const bf16* a,
                                     const bf16* g, const float* ape, const bf16* dpooled,
                                     bf16* da, bf16* dg) {
  const long idx = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<long>(capacity) * d) return;
  const int e = static_cast<int>(idx / d), c = static_cast<int>(idx % d);
  const CompEntry ent = compressed_entry(entries, e);
  if (ent.row0 < 0) return;
  const int m = entries.ratio;
  const bool overlap = m == 4;
  const int width = overlap ? 2 * d : d;
  const int first = overlap && ent.pos > 0 ? 0 : m;
  auto token_of = [&](int k) { return k < m ? ent.row0 - m + k : ent.row0 + (k - m); };
  auto col_of = [&](int k) { return k < m ? c : (overlap ? d + c : c); };
  auto slot_of = [&](int k) { return k < m ? k : k - m; };
  float mx = -INFINITY;
  for (int k = first; k < 2 * m; ++k)
    mx = fmaxf(mx, __bfloat162float(g[static_cast<long>(token_of(k)) * width + col_of(k)]) +
                       ape[slot_of(k) * width + col_of(k)]);
  float z = 0.0f, pooled = 0.0f;
  for (int k = first; k < 2 * m; ++k) {
    const long at = static_cast<long>(token_of(k)) * width + col_of(k);
    const float w = expf(__bfloat162float(g[at]) + ape[slot_of(k) * width + col_of(k)] - mx);
    z += w;
    pooled += w * __bfloat162float(a[at]);
  }
  pooled /= z;
  const float grad = __bfloat162float(dpooled[static_cast<long>(e) * d + c]);
  for (int k = first; k < 2 * m; ++k) {
    const long at = static_cast<long>(token_of(k)) * width + col_of(k);
    const float p = expf(__bfloat162float(g[at]) + ape[slot_of(k) * width + col_of(k)] - mx) / z;
    da[at] = __float2bfloat16_rn(p * grad);
    dg[at] = __float2bfloat16_rn(p * (__bfloat162float(a[at]) - pooled) * grad);
  }
}

// dape[slot, col] += sum over compressed entries e of the score gradient of e's candidate
// (slot, col): dg of e's block row `slot` (m = 4: the B half), or for the A half (m = 4) of
// its previous block's row. Summed per entry, so a context-parallel rank adds exactly its
// owned entries' terms (a block's A half feeds the next entry, which another rank may own).
constexpr int kApeWarps = 16;
__global__ void __launch_bounds__(kApeWarps * 32)
    ape_grad_kernel(int capacity, CompEntries entries, int width, const bf16* dg, float* dape) {
  __shared__ float warp_part[kApeWarps][32];
  const int m = entries.ratio;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int idx = blockIdx.x * 32 + lane;
  const bool real = idx < m * width;
  const int slot = idx / width, col = idx % width;
  const bool prev_half = m == 4 && col < width / 2;
  float acc = 0.0f;
  if (real)
    for (int e = warp; e < capacity; e += kApeWarps) {
      const CompEntry ent = compressed_entry(entries, e);
      if (ent.row0 < 0) {
        if (entries.row0 == nullptr) break;  // one GPU: the entries end here (all later too)
        continue;                            // a table: unused slots anywhere
      }
      if (prev_half && ent.pos == 0) continue;  // the first block has no previous candidates
      const long row = prev_half ? ent.row0 - m + slot : ent.row0 + slot;
      acc += __bfloat162float(dg[row * width + col]);
    }
  warp_part[warp][lane] = acc;
  __syncthreads();
  if (warp == 0 && real) {
    float s = warp_part[0][lane];
#pragma unroll
    for (int w = 1; w < kApeWarps; ++w) s += warp_part[w][lane];
    dape[idx] += s;
  }
}

}  // namespace

void launch_compressor_pool_backward(const LayerDims& d, const DeviceMetadata& meta, int width_d,
                                     const bf16* a, const bf16* g, const float* ape,
                                     const bf16* dpooled, bf16* da, bf16* dg, float* dape,
                                     cudaStream_t stream) {
  const int width = d.coff * width_d;
  CSATTN_CUDA_CHECK(cudaMemsetAsync(da, 0, sizeof(bf16) * static_cast<std::size_t>(d.rows) * width, stream));
  CSATTN_CUDA_CHECK(cudaMemsetAsync(dg, 0, sizeof(bf16) * static_cast<std::size_t>(d.rows) * width, stream));
  const long total = static_cast<long>(d.comp_capacity) * width_d;
  if (total > 0) {
    pool_backward_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(
        d.comp_capacity, comp_entries(d, meta), width_d, a, g, ape, dpooled, da, dg);
    CSATTN_CUDA_LAUNCH_CHECK();
  }
  const int n = d.ratio * width;
  ape_grad_kernel<<<(n + 31) / 32, kApeWarps * 32, 0, stream>>>(d.comp_capacity, comp_entries(d, meta),
                                                               width, dg, dape);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
