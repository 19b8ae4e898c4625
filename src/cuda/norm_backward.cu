// RMSNorm backward (row kernel for dx, fixed-order column kernel for the weight), plus the
// small reductions and conversions the backward shares.
#include "cuda/backward_kernels.hpp"
#include "cuda/check.hpp"
#include "cuda/device_util.cuh"

namespace csattn::cuda {

namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads)
    rmsnorm_backward_kernel(const bf16* x, const bf16* weight, const bf16* dy, int n, float eps,
                            bf16* dx, float* rstd, const float* given_rstd,
                            const std::int32_t* comp_start, int segments) {
  __shared__ float scratch[32];
  const int row = blockIdx.x;
  if (comp_start && row >= comp_start[segments]) return;
  const bf16* xr = x + static_cast<long>(row) * n;
  const bf16* gr = dy + static_cast<long>(row) * n;
  float ss = 0.0f, dot = 0.0f;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float xv = __bfloat162float(xr[i]);
    const float w = weight ? __bfloat162float(weight[i]) : 1.0f;
    ss += xv * xv;
    dot += __bfloat162float(gr[i]) * w * xv;
  }
  ss = block_sum(ss, scratch);
  dot = block_sum(dot, scratch);
  // From the input x: r = 1 / rms(x), dx = r dy w - r^3 x <dy w, x> / n. From the weightless
  // norm's output y = r x and its stored r: the same, r (dy - y <dy, y> / n).
  const float r = given_rstd ? given_rstd[row] : 1.0f / sqrtf(ss / n + eps);
  const float c = given_rstd ? r * dot / n : r * r * r * dot / n;
  bf16* out = dx + static_cast<long>(row) * n;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float w = weight ? __bfloat162float(weight[i]) : 1.0f;
    out[i] = __float2bfloat16_rn(r * __bfloat162float(gr[i]) * w - c * __bfloat162float(xr[i]));
  }
  if (rstd != nullptr && threadIdx.x == 0) rstd[row] = r;
}

// dweight[i] += sum_rows dy[r, i] x[r, i] rstd[r], rows in order.
__global__ void rmsnorm_weight_grad_kernel(const bf16* x, const bf16* dy, const float* rstd,
                                           int rows, int n, float* dweight,
                                           const std::int32_t* comp_start, int segments) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int used = comp_start ? min(rows, comp_start[segments]) : rows;
  float acc = 0.0f;
  for (int r = 0; r < used; ++r) {
    const long k = static_cast<long>(r) * n + i;
    acc += __bfloat162float(dy[k]) * __bfloat162float(x[k]) * rstd[r];
  }
  dweight[i] += acc;
}

__global__ void column_sum_kernel(const float* part, int rows, int cols, float* dst) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= cols) return;
  float acc = 0.0f;
  for (int r = 0; r < rows; ++r) acc += part[static_cast<long>(r) * cols + i];
  dst[i] += acc;
}

__global__ void f32_to_bf16_kernel(const float* src, bf16* dst, long n) {
  const long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = __float2bfloat16_rn(src[i]);
}

}  // namespace

void launch_rmsnorm_backward(const bf16* x, const bf16* weight, const bf16* dy, int rows, int n,
                             float eps, bf16* dx, float* dweight, float* rstd,
                             const std::int32_t* comp_start, int segments, cudaStream_t stream) {
  if (rows <= 0) return;
  rmsnorm_backward_kernel<<<rows, kThreads, 0, stream>>>(x, weight, dy, n, eps, dx, rstd, nullptr,
                                                         comp_start, segments);
  CSATTN_CUDA_LAUNCH_CHECK();
  if (dweight) {
    rmsnorm_weight_grad_kernel<<<(n + 127) / 128, 128, 0, stream>>>(x, dy, rstd, rows, n, dweight,
                                                                    comp_start, segments);
    CSATTN_CUDA_LAUNCH_CHECK();
  }
}

void launch_rmsnorm_backward_from_output(const bf16* y, const float* rstd, const bf16* dy, int rows,
                                         int n, bf16* dx, cudaStream_t stream) {
  if (rows <= 0) return;
  rmsnorm_backward_kernel<<<rows, kThreads, 0, stream>>>(y, nullptr, dy, n, 0.0f, dx, nullptr, rstd,
                                                         nullptr, 0);
  CSATTN_CUDA_LAUNCH_CHECK();
}

void launch_column_sum(const float* part, int rows, int cols, float* dst, cudaStream_t stream) {
  if (cols <= 0) return;
  column_sum_kernel<<<(cols + 127) / 128, 128, 0, stream>>>(part, rows, cols, dst);
  CSATTN_CUDA_LAUNCH_CHECK();
}

void launch_f32_to_bf16(const float* src, bf16* dst, long n, cudaStream_t stream) {
  if (n <= 0) return;
  f32_to_bf16_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(src, dst, n);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
