// The key list of one query, shared by the attention kernels: window rows first (raw kv row
// r >= 0), then compressed rows encoded as -(row + 1): HCA all visible entries, CSA the valid
// ids of the top-k row (valid ids first, then -1). Called by every thread of the block;
// returns the count after a __syncthreads.
#pragma once
#include "cuda/params.hpp"

namespace csattn::cuda {

__device__ __forceinline__ const bf16* key_row_ptr(int id, const bf16* kv, const bf16* comp, int D) {
  return id >= 0 ? kv + static_cast<long>(id) * D : comp + static_cast<long>(-id - 1) * D;
}
// The fp32 gradient row of the same key: the raw kv rows' or the compressed rows' accumulator.
__device__ __forceinline__ float* key_grad_row(int id, float* dkv, float* dcomp, int D) {
  return id >= 0 ? dkv + static_cast<long>(id) * D : dcomp + static_cast<long>(-id - 1) * D;
}

__device__ __forceinline__ int build_key_list(const LayerDims& d, const DeviceMetadata& meta,
                                              const std::int32_t* topk, int t, int* ids,
                                              int* shared_count) {
  const int b = meta.row_segment[t], pos = meta.row_position[t];
  const int seg_start = meta.cu_padded[b];
  const int w0 = max(0, pos - d.window + 1), n_win = pos - w0 + 1;
  if (d.ratio == 4) {
    if (threadIdx.x == 0) {
      int c = 0;
      const std::int32_t* sel = topk + static_cast<long>(t) * d.topk;
      for (int k = 0; k < d.topk; ++k)
        if (sel[k] >= 0) ids[n_win + c++] = -(meta.comp_start[b] + sel[k] + 1);
      *shared_count = n_win + c;
    }
  } else {
    const int n_comp = d.ratio > 1 ? min((pos + 1) / d.ratio, meta.comp_start[b + 1] - meta.comp_start[b]) : 0;
    for (int j = threadIdx.x; j < n_comp; j += blockDim.x) ids[n_win + j] = -(meta.comp_start[b] + j + 1);
    if (threadIdx.x == 0) *shared_count = n_win + n_comp;
  }
  for (int i = threadIdx.x; i < n_win; i += blockDim.x) ids[i] = seg_start + w0 + i;
  __syncthreads();
  return *shared_count;
}


}  // namespace csattn::cuda
