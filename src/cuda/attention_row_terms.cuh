// The per-head-row terms the attention backward kernels compute before their key loop, for one
// query token t and the head rows h0 .. h0 + 63 of a CTA:
//   D_row = dO . O (fp32 over the bf16 tensors), the softmax-gradient row term;
//   dsink_part[t, h] = -exp(sink_h - LSE) * D_row (the sink's gradient, summed over rows later);
//   LSE in log2 units, +inf past H so that P = exp2(S - LSE2) = 0 on those rows.
#pragma once
#include <cuda_bf16.h>

#include <cmath>

#include "cuda/device_util.cuh"

namespace csattn::cuda {

constexpr float kAttentionLog2e = 1.4426950408889634f;

// The fp32 dot product of two 16-byte groups of 8 bf16 (a 16-byte load each), in element order.
__device__ __forceinline__ float dot_bf16x8(const void* a, const void* b) {
  const uint4 av = *reinterpret_cast<const uint4*>(a);
  const uint4 bv = *reinterpret_cast<const uint4*>(b);
  const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&av);
  const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&bv);
  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 af = __bfloat1622float2(a2[k]), bf = __bfloat1622float2(b2[k]);
    acc += af.x * bf.x + af.y * bf.y;
  }
  return acc;
}

// Called by every thread of the CTA (blockDim.x a multiple of 32); warp w takes rows w,
// w + warps, ... of the 64; lane l reads dims 8 l .. 8 l + 7 and 256 + 8 l .. of a row (16-byte
// loads). drow_s / lse2_s: [64] floats of shared memory, visible after the caller's barrier.
__device__ __forceinline__ void attention_row_terms(int H, int D, int t, int h0, const bf16* out,
                                                    const bf16* dout, const float* lse,
                                                    const float* sink, float* dsink_part,
                                                    float* drow_s, float* lse2_s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int r = warp; r < 64; r += warps) {
    const int h = h0 + r;
    if (h >= H) {  // uniform per warp
      if (lane == 0) {
        drow_s[r] = 0.0f;
        lse2_s[r] = INFINITY;
      }
      continue;
    }
    const long base = (static_cast<long>(t) * H + h) * D;
    float acc = 0.0f;
    for (int dim = lane * 8; dim < D; dim += 256) acc += dot_bf16x8(out + base + dim, dout + base + dim);
    acc = warp_sum(acc);
    if (lane == 0) {
      const float l = lse[static_cast<long>(t) * H + h];
      drow_s[r] = acc;
      lse2_s[r] = l * kAttentionLog2e;
      dsink_part[static_cast<long>(t) * H + h] = -expf(sink[h] - l) * acc;
    }
  }
}

}  // namespace csattn::cuda
