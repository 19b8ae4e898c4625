// Row movements of the GPU context-parallel layer (cp_rows.cu): gathers and scatters of
// whole rows through index lists built on the host from the layer plan. Rows are moved as
// 4-byte words (bf16 rows of even width, f32 rows), so one kernel serves every dtype.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace csattn::cuda {

// dst[i] = src[idx[i]] for i < n (idx[i] < 0: a zero row); rows of `words` 4-byte words.
void launch_gather_rows(const void* src, const std::int32_t* idx, int n, int words, void* dst,
                        cudaStream_t stream);
// dst[idx[i]] = src[i] for i < n (the idx distinct).
void launch_scatter_rows(const void* src, const std::int32_t* idx, int n, int words, void* dst,
                         cudaStream_t stream);
// dst[idx[i]] += src[i] for i < n, f32 rows of `cols` (the idx distinct).
void launch_add_rows(const float* src, const std::int32_t* idx, int n, int cols, float* dst,
                     cudaStream_t stream);
// dst[q] = sum over k in [offsets[q], offsets[q+1]) of src[rows[k]], in k order (0 for an
// empty range), for q < n: the fixed-order sum of each gathered row's copies.
void launch_sum_rows(const float* src, const std::int32_t* offsets, const std::int32_t* rows,
                     int n, int cols, float* dst, cudaStream_t stream);

}  // namespace csattn::cuda
