#include "cuda/check.hpp"
#include "cuda/cp_rows.hpp"

namespace csattn::cuda {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(long work) { return static_cast<unsigned>((work + kThreads - 1) / kThreads); }

__global__ void gather_rows_kernel(const std::uint32_t* src, const std::int32_t* idx, int n,
                                   int words, std::uint32_t* dst) {
  const long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<long>(n) * words) return;
  const long r = i / words, w = i % words;
  const int s = idx[r];
  dst[i] = s >= 0 ? src[static_cast<long>(s) * words + w] : 0u;
}

__global__ void scatter_rows_kernel(const std::uint32_t* src, const std::int32_t* idx, int n,
                                    int words, std::uint32_t* dst) {
  const long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<long>(n) * words) return;
  const long r = i / words, w = i % words;
  dst[static_cast<long>(idx[r]) * words + w] = src[i];
}

__global__ void add_rows_kernel(const float* src, const std::int32_t* idx, int n, int cols,
                                float* dst) {
  const long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<long>(n) * cols) return;
  const long r = i / cols, c = i % cols;
  dst[static_cast<long>(idx[r]) * cols + c] += src[i];
}

__global__ void sum_rows_kernel(const float* src, const std::int32_t* offsets,
                                const std::int32_t* rows, int n, int cols, float* dst) {
  const long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<long>(n) * cols) return;
  const long q = i / cols, c = i % cols;
  float acc = 0.0f;
  for (int k = offsets[q]; k < offsets[q + 1]; ++k) acc += src[static_cast<long>(rows[k]) * cols + c];
  dst[i] = acc;
}

}  // namespace

void launch_gather_rows(const void* src, const std::int32_t* idx, int n, int words, void* dst,
                        cudaStream_t stream) {
  if (n <= 0 || words <= 0) return;
  gather_rows_kernel<<<blocks_for(static_cast<long>(n) * words), kThreads, 0, stream>>>(
      static_cast<const std::uint32_t*>(src), idx, n, words, static_cast<std::uint32_t*>(dst));
  CSATTN_CUDA_LAUNCH_CHECK();
}

void launch_scatter_rows(const void* src, const std::int32_t* idx, int n, int words, void* dst,
                         cudaStream_t stream) {
  if (n <= 0 || words <= 0) return;
  scatter_rows_kernel<<<blocks_for(static_cast<long>(n) * words), kThreads, 0, stream>>>(
      static_cast<const std::uint32_t*>(src), idx, n, words, static_cast<std::uint32_t*>(dst));
  CSATTN_CUDA_LAUNCH_CHECK();
}

void launch_add_rows(const float* src, const std::int32_t* idx, int n, int cols, float* dst,
                     cudaStream_t stream) {
  if (n <= 0 || cols <= 0) return;
  add_rows_kernel<<<blocks_for(static_cast<long>(n) * cols), kThreads, 0, stream>>>(src, idx, n,
                                                                                   cols, dst);
  CSATTN_CUDA_LAUNCH_CHECK();
}

void launch_sum_rows(const float* src, const std::int32_t* offsets, const std::int32_t* rows,
                     int n, int cols, float* dst, cudaStream_t stream) {
  if (n <= 0 || cols <= 0) return;
  sum_rows_kernel<<<blocks_for(static_cast<long>(n) * cols), kThreads, 0, stream>>>(
      src, offsets, rows, n, cols, dst);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
