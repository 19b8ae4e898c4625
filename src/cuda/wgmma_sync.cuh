// Synchronisation for warp-specialised Hopper kernels (sm_90): shared-memory mbarriers with
// phase parity, cp.async completion tracked by an mbarrier, named barriers between subsets of
// warps, the generic -> async proxy fence (wgmma reads shared memory through the async proxy),
// TMA tile loads completing on an mbarrier, TMA tile stores in bulk async-groups, and
// setmaxnreg. PTX ISA sections: "mbarrier", "cp.async.mbarrier.arrive", "cp.async.bulk.tensor",
// "cp.async.bulk.wait_group", "bar.sync", "fence.proxy.async", "setmaxnreg", and L2 cache
// policies for streamed data ("createpolicy", the loads' and stores' .L2::cache_hint).
#pragma once
#include <cstdint>

namespace csattn::cuda {

__device__ __forceinline__ void mbar_init(std::uint32_t bar, std::uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes initialised barriers visible to the other threads (and the async proxy) before use.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(std::uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Blocks until the phase with the given parity has completed. A fresh barrier is in phase 0,
// and waiting on parity 1 returns at once (the "preceding phase" counts as complete): a
// producer's first pass over empty stages waits on parity 1.
__device__ __forceinline__ void mbar_wait(std::uint32_t bar, std::uint32_t parity) {
  std::uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}
// This thread's arrival, announcing `bytes` more of asynchronous writes (TMA's complete_tx)
// before the phase can complete.
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint32_t bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// TMA: the box at (x = column, y = row) of the 2-D tensor map `map` (a __grid_constant__
// kernel parameter, tma.hpp) into shared memory at dst, counted on `bar` in bytes.
__device__ __forceinline__ void tma_load_2d(std::uint32_t dst, const void* map, int x, int y,
                                            std::uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(reinterpret_cast<std::uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
// One arrive-on the barrier once all of this thread's earlier cp.async copies have landed
// (.noinc: the arrival counts against the barrier's expected count, which must include it).
__device__ __forceinline__ void cp_async_mbar_arrive(std::uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// 16-byte cp.async that writes zeros instead when `real` is false (source size 0: nothing is
// read, `src` must still be a valid address).
__device__ __forceinline__ void cp_async_16_zfill(std::uint32_t dst, const void* src, bool real) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(real ? 16 : 0)
               : "memory");
}
// An L2 cache policy for data touched once (a kernel's streams beside a working set it reuses):
// its lines are the first L2 evicts.
__device__ __forceinline__ std::uint64_t l2_evict_first_policy() {
  std::uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// cp_async_16_zfill with an L2 cache policy.
__device__ __forceinline__ void cp_async_16_zfill_hint(std::uint32_t dst, const void* src, bool real,
                                                       std::uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
               "r"(real ? 16 : 0), "l"(policy)
               : "memory");
}
// TMA store: the box at shared-memory address src to (x = column, y = head, z = token) of the
// 3-D tensor map `map` (a __grid_constant__ kernel parameter, tma.hpp), under an L2 cache
// policy, in this thread's bulk async-group (closed by bulk_commit_group). The writer threads
// of src must have run fence_proxy_async_smem and synchronised with this thread first.
__device__ __forceinline__ void tma_store_3d(const void* map, std::uint32_t src, int x, int y, int z,
                                             std::uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group.L2::cache_hint [%0, {%2, %3, %4}], [%1], %5;\n"
      ::"l"(reinterpret_cast<std::uint64_t>(map)), "r"(src), "r"(x), "r"(y), "r"(z), "l"(policy)
      : "memory");
}
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until at most N of this thread's bulk groups are still reading their shared memory (the
// source may then be rewritten; their global writes may still be in flight).
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Until all of this thread's bulk groups are complete, their global writes included.
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// Hint: bring the 128-byte line holding `p` into L2.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// Named barrier `id` (1..15; 0 is __syncthreads) over `count` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Arrives on named barrier `id` without waiting (the producer side of a hand-over whose
// consumer calls named_barrier_sync with the same count).
__device__ __forceinline__ void named_barrier_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Shared memory written through the generic proxy (st.shared, cp.async) and read next by
// wgmma (async proxy): the writer's or the reader's fence before the hand-over.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Re-balances registers between warpgroups (all warps of a warpgroup execute it).
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

}  // namespace csattn::cuda
