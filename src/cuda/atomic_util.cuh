// Vector fp32 reductions into global memory (sm_90+ PTX). One red.global.add.v4.f32 adds 16
// aligned bytes in one L2 transaction instead of four scalar atomics; no value is returned,
// so the issuing thread never waits for it.
#pragma once

#include <cstdint>

namespace csattn::cuda {

// dst[0..3] += v (dst 16-byte aligned, global memory).
__device__ __forceinline__ void red_add_v4(float* dst, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(a), "f"(b),
               "f"(c), "f"(d)
               : "memory");
}

// red_add_v4 at byte address `addr` where `on`, written as one predicated instruction. ptxas
// may still branch around it, but the kernel it ends in is leaner: in the attention backward's
// line flush it saved ~100 register moves against `if (on) red_add_v4(...)` (same loads, same
// reductions). The address is an integer so that a caller may form it for a slot that is off
// (base 0 plus an offset): pointer arithmetic on a null pointer is undefined in C++, and a
// compiler allowed to assume the pointer non-null could drop the predicate.
__device__ __forceinline__ void red_add_v4_if(bool on, std::uint64_t addr, float a, float b, float c, float d) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %0, 0;\n @p red.global.add.v4.f32 [%1], {%2, %3, %4, %5};\n}\n" ::"r"(
          static_cast<int>(on)),
      "l"(addr), "f"(a), "f"(b), "f"(c), "f"(d)
      : "memory");
}

// red_add_v4 with an L2 eviction priority for the line it adds into (`policy` from
// createpolicy). The policy must be the same in every lane of the warp: SASS keeps it in a
// uniform register (R2UR), so a lane-varying one silently becomes one lane's. Measurement
// only so far (the reductions section's kept rows).
__device__ __forceinline__ void red_add_v4_hinted(float* dst, float a, float b, float c, float d,
                                                  std::uint64_t policy) {
  asm volatile("red.global.add.L2::cache_hint.v4.f32 [%0], {%1, %2, %3, %4}, %5;\n" ::"l"(dst), "f"(a),
               "f"(b), "f"(c), "f"(d), "l"(policy)
               : "memory");
}
// The L2 policy evict_last for the hinted accesses (the same in every lane).
__device__ __forceinline__ std::uint64_t l2_policy_evict_last() {
  std::uint64_t p;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}

}  // namespace csattn::cuda
