// Kernels that check_kernels.py must flag (probe_serialized, probe_stack) and one it must
// pass (probe_pipelined): the checker's own test (ctest kernel_checks_catch_probes). Built
// as an object library for sm_90a with the backend's flags; never launched.
#include <cstdint>

#include "cuda/mma_util.cuh"
#include "cuda/wgmma.cuh"

namespace csattn::cuda {

// One committed group of 8 wgmmas accumulating into acc (operands anywhere: never launched).
__device__ __forceinline__ void issue_group(float (&acc)[32], std::uint32_t base) {
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < 8; ++k)
    wgmma_m64n64k16_ss<0>(acc, wgmma_desc_sw128(base + 32 * k, 16, 1024),
                          wgmma_desc_sw128(base + 8192 + 32 * k, 16, 1024), 1);
  wgmma_commit();
}

// One group of 8 wgmmas, waited for before the accumulator is read: one group per 8 HGMMAs.
__global__ void probe_pipelined(float* out, int tiles) {
  extern __shared__ unsigned char smem[];
  const std::uint32_t base = smem_addr(smem);
  float acc[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
  for (int t = 0; t < tiles; ++t) {
    issue_group(acc, base);
    wgmma_wait<0>();
    wgmma_pin(acc);
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] *= 0.5f;
  }
#pragma unroll
  for (int i = 0; i < 32; ++i) out[threadIdx.x * 32 + i] = acc[i];
}

// The accumulator is read while its group may still be in flight (wait_group 1): ptxas
// serialises every wgmma (C7514), each HGMMA closing its own group.
__global__ void probe_serialized(float* out, int tiles) {
  extern __shared__ unsigned char smem[];
  const std::uint32_t base = smem_addr(smem);
  float acc[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
  for (int t = 0; t < tiles; ++t) {
    issue_group(acc, base);
    wgmma_wait<1>();
#pragma unroll
    for (int i = 0; i < 32; ++i) out[i] += acc[i];
  }
}

// 64 live floats under a 32-register cap (256 threads x 8 CTAs an SM): ptxas spills them to
// a stack frame.
__global__ void __launch_bounds__(256, 8) probe_stack(float* out, const int* idx) {
  float v[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) v[i] = out[threadIdx.x + 32 * i];
  const int j = idx[threadIdx.x];
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 64; ++i) s += v[i] * v[(i + j) & 63];
  out[threadIdx.x] = s;
}

}  // namespace csattn::cuda
