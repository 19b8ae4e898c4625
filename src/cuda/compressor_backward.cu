// Compressor pooling backward: one thread per (compressed row, channel) recomputes the
// softmax over its candidates; each (token, column) of the projections feeds exactly one
// entry, so da / dg are written without conflicts. The ape gradient is a fixed-order sum
// over entries of the score gradients of each slot.
#include "cuda/backward_kernels.hpp"
#include "cuda/check.hpp"
#include "cuda/device_util.cuh"

namespace csattn::cuda {

namespace {

__global__ void pool_backward_kernel(int capacity, int segments, int ratio, int d,
                                     const std::int32_t* cu_padded,
                                     const std::int32_t* comp_start, const bf16* a,
                                     const bf16* g, const float* ape, const bf16* dpooled,
                                     bf16* da, bf16* dg) {
  const long idx = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<long>(capacity) * d) return;
  const int e = static_cast<int>(idx / d), c = static_cast<int>(idx % d);
  if (e >= comp_start[segments]) return;
  const int b = compressed_segment(comp_start, segments, e);
  const int j = e - comp_start[b], start = cu_padded[b], m = ratio;
  const bool overlap = m == 4;
  const int width = overlap ? 2 * d : d;
  const int first = overlap && j > 0 ? 0 : m;
  auto token_of = [&](int k) { return k < m ? start + (j - 1) * m + k : start + j * m + (k - m); };
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

// dape[slot, col] += sum over compressed entries e of dg[block start of e + slot, col].
__global__ void ape_grad_kernel(int segments, int ratio, int width,
                                const std::int32_t* cu_padded, const std::int32_t* comp_start,
                                const bf16* dg, float* dape) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= ratio * width) return;
  const int slot = idx / width, col = idx % width;
  float acc = 0.0f;
  for (int b = 0; b < segments; ++b)
    for (int j = 0; j < comp_start[b + 1] - comp_start[b]; ++j)
      acc += __bfloat162float(dg[static_cast<long>(cu_padded[b] + j * ratio + slot) * width + col]);
  dape[idx] += acc;
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
        d.comp_capacity, d.segments, d.ratio, width_d, meta.cu_padded, meta.comp_start, a, g, ape,
        dpooled, da, dg);
    CSATTN_CUDA_LAUNCH_CHECK();
  }
  const int n = d.ratio * width;
  ape_grad_kernel<<<(n + 127) / 128, 128, 0, stream>>>(d.segments, d.ratio, width, meta.cu_padded,
                                                       meta.comp_start, dg, dape);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
