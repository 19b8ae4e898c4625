// The pieces of an index score that every indexer kernel must compute identically, so two
// kernels that sum in the same tree give bit-equal scores (and the same top-k).
#pragma once
#include <cuda_runtime.h>

namespace csattn::cuda {

// Order-preserving map of a float to an unsigned key (larger float -> larger key); -0 is
// mapped like +0 so the two tie as they do on the host.
__device__ __forceinline__ unsigned order_key(float f) {
  unsigned u = __float_as_uint(f);
  if (u == 0x80000000u) u = 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// w0 * ReLU(s0) + w1 * ReLU(s1) for the head pair (h, h + 8) of a 16-head group, with the
// rounding spelled out (one product, then a fused multiply-add) instead of left to the
// compiler's contraction, so the tensor-core kernels agree bit for bit.
__device__ __forceinline__ float head_pair_term(float w0, float s0, float w1, float s1) {
  return __fmaf_rn(w0, fmaxf(s0, 0.0f), __fmul_rn(w1, fmaxf(s1, 0.0f)));
}

}  // namespace csattn::cuda
