// RMSNorm + RoPE + Hadamard on rows, with the bf16 rounding points of docs/numerics.md.
#include <cmath>

#include "cuda/check.hpp"
#include "cuda/device_util.cuh"
#include "cuda/kernels.hpp"

namespace csattn::cuda {

namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) norm_rope_kernel(NormRopeArgs a) {
  extern __shared__ float buf[];  // [n]
  __shared__ float scratch[32];
  const int row = blockIdx.x;
  const int n = a.n;
  int position = 0;
  if (a.compressed) {
    const int total = a.comp_start[a.segments];
    if (row >= total) return;  // capacity rows without an entry
    const int b = compressed_segment(a.comp_start, a.segments, row);
    position = (row - a.comp_start[b]) * a.ratio;
  } else if (a.rope_dim > 0) {
    position = a.row_position[row / a.rows_per_token];
  }
  const bf16* in = a.in + static_cast<long>(row) * n;
  for (int i = threadIdx.x; i < n; i += kThreads) buf[i] = __bfloat162float(in[i]);
  __syncthreads();

  if (a.norm) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += kThreads) ss += buf[i] * buf[i];
    ss = block_sum(ss, scratch);
    const float r = 1.0f / sqrtf(ss / n + a.eps);
    for (int i = threadIdx.x; i < n; i += kThreads) {
      const float w = a.weight ? __bfloat162float(a.weight[i]) : 1.0f;
      buf[i] = round_bf16(buf[i] * r * w);
    }
    __syncthreads();
  }

  if (a.rope_dim > 0) {
    const int half = a.rope_dim / 2, base = n - a.rope_dim;
    for (int i = threadIdx.x; i < half; i += kThreads) {
      // Angles in fp32 as the reference builds them; cos / sin through double so they are
      // correctly rounded like the host's, then cast to bf16 (the table's dtype).
      const float angle = static_cast<float>(position) * a.omega[i];
      const float c = round_bf16(static_cast<float>(cos(static_cast<double>(angle))));
      const float s = round_bf16(static_cast<float>(sin(static_cast<double>(angle)))) *
                      static_cast<float>(a.rope_sign);
      const float x0 = buf[base + 2 * i], x1 = buf[base + 2 * i + 1];
      buf[base + 2 * i] = round_bf16(x0 * c - x1 * s);
      buf[base + 2 * i + 1] = round_bf16(x0 * s + x1 * c);
    }
    __syncthreads();
  }

  if (a.hadamard) {
    for (int len = 1; len < n; len <<= 1) {
      for (int p = threadIdx.x; p < n / 2; p += kThreads) {
        const int blk = p / len, off = p % len;
        const int i = blk * 2 * len + off, j = i + len;
        const float x0 = buf[i], x1 = buf[j];
        buf[i] = x0 + x1;
        buf[j] = x0 - x1;
      }
      __syncthreads();
    }
    const float scale = 1.0f / sqrtf(static_cast<float>(n));
    for (int i = threadIdx.x; i < n; i += kThreads) buf[i] = round_bf16(buf[i] * scale);
    __syncthreads();
  }

  bf16* out = a.out + static_cast<long>(row) * n;
  for (int i = threadIdx.x; i < n; i += kThreads) out[i] = __float2bfloat16_rn(buf[i]);
}

}  // namespace

void launch_norm_rope(const NormRopeArgs& a, cudaStream_t stream) {
  if (a.rows <= 0) return;
  const std::size_t smem = sizeof(float) * static_cast<std::size_t>(a.n);
  allow_dynamic_smem(norm_rope_kernel, smem, "the norm / RoPE kernel");
  norm_rope_kernel<<<a.rows, kThreads, smem, stream>>>(a);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
