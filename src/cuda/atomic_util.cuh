// Vector fp32 reductions into global memory (sm_90+ PTX). One red.global.add.v4.f32 adds 16
// aligned bytes in one L2 transaction instead of four scalar atomics; no value is returned,
// so the issuing thread never waits for it.
#pragma once

namespace csattn::cuda {

// dst[0..3] += v (dst 16-byte aligned, global memory).
__device__ __forceinline__ void red_add_v4(float* dst, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(a), "f"(b),
               "f"(c), "f"(d)
               : "memory");
}

}  // namespace csattn::cuda
