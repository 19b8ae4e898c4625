// L2 eviction priorities for global accesses (Hopper: `createpolicy` policies carried by an
// access's .L2::cache_hint, and prefetches that set one). A policy must be the same in every
// lane of a warp: SASS keeps it in a uniform register (R2UR), so a lane-varying one silently
// becomes one lane's (perf.md, eighteenth session).
#pragma once
#include <cstdint>

namespace csattn::cuda {

// evict_last for every line the hinted accesses touch: kept in L2 over evict_normal and
// evict_first lines (without a persisting set-aside, among the lines not yet evicted).
__device__ __forceinline__ std::uint64_t l2_policy_evict_last() {
  std::uint64_t p;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}

// 16-byte cp.async (as cp_async_16) whose L2 line takes `policy`.
__device__ __forceinline__ void cp_async_16_policy(std::uint32_t dst, const void* src, std::uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "l"(policy));
}

// Brings the 128-byte line holding `p` into L2 at priority evict_last.
__device__ __forceinline__ void prefetch_l2_evict_last(const void* p) {
  asm volatile("prefetch.global.L2::evict_last [%0];\n" ::"l"(p));
}

}  // namespace csattn::cuda
