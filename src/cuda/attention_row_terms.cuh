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

// The fp32 dot product of two 16-byte groups of 8 bf16, in element order.
__device__ __forceinline__ float dot_bf16x8(const uint4& av, const uint4& bv) {
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

// The same of two 16-byte groups in memory.
__device__ __forceinline__ float dot_bf16x8(const void* a, const void* b) {
  const uint4 av = *reinterpret_cast<const uint4*>(a);
  const uint4 bv = *reinterpret_cast<const uint4*>(b);
  return dot_bf16x8(av, bv);
}

// Called by every thread of the CTA (kWarps warps); warp w takes rows w, w + kWarps, ... of the
// 64; lane l reads dims 8 l .. 8 l + 7, 256 + 8 l .. of a row (16-byte loads, kD / 256 of
// them). drow_s / lse2_s: [64] floats of shared memory, visible after the caller's barrier.
// Every load of the warp's rows (O, dO, LSE, sink) is issued before the first is used: a row
// at a time, each row cost two dependent memory round trips (its O / dO, then after the
// shuffles its LSE and sink), sixteen a warp at the backward kernels' 8 warps, in the
// prologue of every CTA - most of an SWA item's time (2 key tiles). The sums are the same, in
// the same order.
template <int kWarps, int kD>
__device__ __forceinline__ void attention_row_terms(int H, int t, int h0, const OutputRows& out, const bf16* dout,
                                                    const float* lse, const float* sink, float* dsink_part,
                                                    float* drow_s, float* lse2_s) {
  static_assert(64 % kWarps == 0 && kD % 256 == 0, "rows a warp, 16-byte groups a lane");
  constexpr int kRowsPerWarp = 64 / kWarps, kGroups = kD / 256;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint4 o[kRowsPerWarp][kGroups], g[kRowsPerWarp][kGroups];
  float l[kRowsPerWarp], s[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int h = h0 + warp + kWarps * i;
    if (h < H) {  // uniform per warp
      const long row = static_cast<long>(t) * H + h, base = row * kD + 8 * lane;
#pragma unroll
      for (int c = 0; c < kGroups; ++c) {
        o[i][c] = *reinterpret_cast<const uint4*>(out.at(row, 256 * c + 8 * lane, kD));
        g[i][c] = *reinterpret_cast<const uint4*>(dout + base + 256 * c);
      }
      l[i] = lse[static_cast<long>(t) * H + h];
      s[i] = sink[h];
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + kWarps * i, h = h0 + r;
    if (h >= H) {
      if (lane == 0) {
        drow_s[r] = 0.0f;
        lse2_s[r] = INFINITY;
      }
      continue;
    }
    float acc = 0.0f;
#pragma unroll
    for (int c = 0; c < kGroups; ++c) acc += dot_bf16x8(o[i][c], g[i][c]);
    acc = warp_sum(acc);
    if (lane == 0) {
      drow_s[r] = acc;
      lse2_s[r] = l[i] * kAttentionLog2e;
      dsink_part[static_cast<long>(t) * H + h] = -expf(s[i] - l[i]) * acc;
    }
  }
}

}  // namespace csattn::cuda
