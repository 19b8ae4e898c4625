// Small device helpers shared by the kernels.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/params.hpp"

namespace csattn::cuda {

__device__ __forceinline__ float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

// One RoPE pair rotated by (c, s) (s carries the rotation's sign), each result rounded to
// bf16: every RoPE kernel rotates through this, so they agree bit for bit.
__device__ __forceinline__ void rotate_pair(float& x0, float& x1, float c, float s) {
  const float a = x0, b = x1;
  x0 = round_bf16(a * c - b * s);
  x1 = round_bf16(a * s + b * c);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
// `scratch` holds 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += scratch[w];  // fixed order: deterministic
  return total;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < warps; ++w) m = fmaxf(m, scratch[w]);
  return m;
}

// The segment owning compressed row e: the largest b with comp_start[b] <= e.
__device__ __forceinline__ int compressed_segment(const std::int32_t* comp_start, int segments,
                                                  int e) {
  int lo = 0, hi = segments - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (comp_start[mid] <= e) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// The window of the query of segment b at position pos: n keys, the first at row `row0`.
// By position, not by the query's row: the kernels' contract lets query rows and key rows be
// different index spaces (the kernel tests and benchmarks score a subset of positions
// against a longer key buffer); a rows-only version failed those tests on the H200.
// It starts at max(pos - W + 1, the segment's first position): 0 on one GPU; a
// context-parallel run's halo rows hold the whole window of its own rows (a halo row's
// window is cut at the run start, never read from another run).
struct QueryWindow {
  int n, row0;
};
__device__ __forceinline__ QueryWindow query_window(const LayerDims& d, const DeviceMetadata& m,
                                                    int b, int pos) {
  const int p0 = m.seg_pos0 != nullptr ? m.seg_pos0[b] : 0;
  const int w0 = max(p0, pos - d.window + 1);
  return {pos - w0 + 1, m.cu_padded[b] + (w0 - p0)};
}

// Compressed row e as the compressor kernels address it: the first row of its block (-1: a
// capacity row without an entry) and its position j*m. One GPU: entry j of segment b is
// block j of the segment; a context-parallel rank: the explicit table of its owned groups
// (CompEntries, params.hpp).
struct CompEntry {
  int row0, pos;
};
__device__ __forceinline__ CompEntry compressed_entry(const CompEntries& c, int e) {
  if (c.row0 != nullptr) return {c.row0[e], c.pos[e]};
  if (e >= c.comp_start[c.segments]) return {-1, 0};
  const int b = compressed_segment(c.comp_start, c.segments, e);
  const int j = e - c.comp_start[b];
  return {c.cu_padded[b] + j * c.ratio, j * c.ratio};
}

}  // namespace csattn::cuda
