// Per-row metadata from the device copies of cu_seqlens: rebuilt on every run, so a replay
// with new lengths never sees stale values.
#include "cuda/check.hpp"
#include "cuda/kernels.hpp"

namespace csattn::cuda {

namespace {

__global__ void row_metadata_kernel(const std::int32_t* cu_real, const std::int32_t* cu_padded,
                                    int segments, int rows, std::int32_t* row_segment,
                                    std::int32_t* row_position, std::uint8_t* row_is_padding) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= rows) return;
  // The segment holding row t: the largest b with cu_padded[b] <= t (empty segments before
  // it share its start and lose to it).
  int lo = 0, hi = segments - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu_padded[mid] <= t) lo = mid; else hi = mid - 1;
  }
  const int pos = t - cu_padded[lo];
  row_segment[t] = lo;
  row_position[t] = pos;
  row_is_padding[t] = pos >= cu_real[lo + 1] - cu_real[lo] ? 1 : 0;
}

__global__ void comp_start_kernel(const std::int32_t* cu_padded, int segments, int ratio,
                                  std::int32_t* comp_start) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  int acc = 0;
  comp_start[0] = 0;
  for (int b = 0; b < segments; ++b) {
    if (ratio > 1) acc += (cu_padded[b + 1] - cu_padded[b]) / ratio;
    comp_start[b + 1] = acc;
  }
}

// The indexer loss's scale from the real rows on the device (DeviceMetadata::loss_scale).
// The same arithmetic as the host's loss_scale_of (workspace.cpp): double, then float.
__global__ void loss_scale_kernel(const std::int32_t* cu_real, int segments, double coeff,
                                  bool per_token, float* scale) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const int real = cu_real[segments];
  scale[0] = per_token ? static_cast<float>(coeff)
                       : (real > 0 ? static_cast<float>(coeff / static_cast<double>(real)) : 0.0f);
}

}  // namespace

void launch_metadata(const LayerDims& d, const DeviceMetadata& meta, cudaStream_t stream) {
  if (d.rows > 0) {
    row_metadata_kernel<<<(d.rows + 255) / 256, 256, 0, stream>>>(
        meta.cu_real, meta.cu_padded, d.segments, d.rows, meta.row_segment, meta.row_position,
        meta.row_is_padding);
    CSATTN_CUDA_LAUNCH_CHECK();
  }
  comp_start_kernel<<<1, 32, 0, stream>>>(meta.cu_padded, d.segments, d.ratio, meta.comp_start);
  CSATTN_CUDA_LAUNCH_CHECK();
  if (meta.loss_scale != nullptr) {
    loss_scale_kernel<<<1, 32, 0, stream>>>(meta.cu_real, d.segments, d.loss_coeff, d.per_token_loss,
                                            meta.loss_scale);
    CSATTN_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace csattn::cuda
