// Gated pooling of the compressors: one thread per (compressed row, channel). Adjacent
// threads read adjacent channels of the same token rows, so loads are coalesced.
#include "cuda/check.hpp"
#include "cuda/device_util.cuh"
#include "cuda/kernels.hpp"

namespace csattn::cuda {

namespace {

__global__ void compressor_pool_kernel(int capacity, int segments, int ratio, int d,
                                       const std::int32_t* cu_padded,
                                       const std::int32_t* comp_start, const bf16* a,
                                       const bf16* g, const float* ape, bf16* pooled) {
  const long idx = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<long>(capacity) * d) return;
  const int e = static_cast<int>(idx / d), c = static_cast<int>(idx % d);
  if (e >= comp_start[segments]) return;
  const int b = compressed_segment(comp_start, segments, e);
  const int j = e - comp_start[b];
  const int start = cu_padded[b];
  const int m = ratio;
  const bool overlap = m == 4;
  const int width = overlap ? 2 * d : d;
  // Candidates: (token, column, slot). m = 4: block j-1 through the A half (if j > 0), then
  // block j through the B half; m = 128: block j.
  const int first_prev = overlap && j > 0 ? 0 : m;  // m means "no previous candidates"
  auto token_of = [&](int k) { return k < m ? start + (j - 1) * m + k : start + j * m + (k - m); };
  auto col_of = [&](int k) { return k < m ? c : (overlap ? d + c : c); };
  auto slot_of = [&](int k) { return k < m ? k : k - m; };
  float mx = -INFINITY;
  for (int k = first_prev; k < 2 * m; ++k) {
    const float s = __bfloat162float(g[static_cast<long>(token_of(k)) * width + col_of(k)]) +
                    ape[slot_of(k) * width + col_of(k)];
    mx = fmaxf(mx, s);
  }
  float z = 0.0f;
  for (int k = first_prev; k < 2 * m; ++k) {
    const float s = __bfloat162float(g[static_cast<long>(token_of(k)) * width + col_of(k)]) +
                    ape[slot_of(k) * width + col_of(k)];
    z += expf(s - mx);
  }
  float acc = 0.0f;
  for (int k = first_prev; k < 2 * m; ++k) {
    const long at = static_cast<long>(token_of(k)) * width + col_of(k);
    const float s = __bfloat162float(g[at]) + ape[slot_of(k) * width + col_of(k)];
    acc += (expf(s - mx) / z) * __bfloat162float(a[at]);
  }
  pooled[static_cast<long>(e) * d + c] = __float2bfloat16_rn(acc);
}

}  // namespace

void launch_compressor_pool(const LayerDims& d, const DeviceMetadata& meta, int width_d,
                            const bf16* a, const bf16* g, const float* ape, bf16* pooled,
                            cudaStream_t stream) {
  const long total = static_cast<long>(d.comp_capacity) * width_d;
  if (total <= 0) return;
  compressor_pool_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(
      d.comp_capacity, d.segments, d.ratio, width_d, meta.cu_padded, meta.comp_start, a, g,
      ape, pooled);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
