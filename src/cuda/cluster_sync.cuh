// Thread-block-cluster synchronisation for sm_90 kernels whose CTAs share work through
// distributed shared memory: the CTA's rank in its cluster, a shared-memory address mapped into
// a peer CTA, mbarrier arrivals on a peer's barrier, a TMA tensor load multicast into several
// CTAs (each counting it on its own mbarrier), and the cluster-wide barrier. PTX ISA sections:
// "mapa", "mbarrier.arrive", "mbarrier.try_wait", "cp.async.bulk.tensor", "barrier.cluster".
#pragma once
#include <cstdint>

namespace csattn::cuda {

__device__ __forceinline__ std::uint32_t cluster_ctarank() {
  std::uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// The address in CTA `rank`'s shared memory (a shared::cluster address) of the variable at
// `addr` in this CTA's.
__device__ __forceinline__ std::uint32_t mapa_shared(std::uint32_t addr, std::uint32_t rank) {
  std::uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}

// One arrival on the mbarrier at `cluster_addr` (mapa_shared of a peer's barrier), at the
// default semantics (release, CTA scope). For a consumer announcing that its wgmma reads of a
// buffer are done (wgmma.wait_group has retired them) nothing else must be ordered before it;
// the .release.cluster form costs a GPU-wide MEMBAR per arrival (it also waits for the CTA's
// outstanding global stores), which this one does not.
__device__ __forceinline__ void mbar_arrive_cluster(std::uint32_t cluster_addr) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_addr) : "memory");
}

__device__ __forceinline__ std::uint32_t cluster_nctarank() {
  std::uint32_t n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
  return n;
}

// mbar_wait for a barrier that peers arrive on: the acquire is at cluster scope, so what the
// arriving peer released is visible to this thread after it.
__device__ __forceinline__ void mbar_wait_cluster(std::uint32_t bar, std::uint32_t parity) {
  std::uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}

// TMA: the box at (x = column, y = row) of the 2-D tensor map `map` (a __grid_constant__ kernel
// parameter, tma.hpp) into shared memory at `dst` (this CTA's address) of every CTA in
// `cta_mask`, each counting its bytes as complete_tx on its own mbarrier at `bar`'s offset.
__device__ __forceinline__ void tma_load_2d_multicast(std::uint32_t dst, const void* map, int x, int y,
                                                      std::uint32_t bar, std::uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(x), "r"(y), "r"(bar), "h"(cta_mask)
      : "memory");
}

// Every thread of every CTA of the cluster: arrive (release) and wait (acquire). Before the
// first access to a peer's shared memory (its barriers initialised) and before a CTA exits
// while a peer may still arrive on its barriers or copy into it.
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

}  // namespace csattn::cuda
