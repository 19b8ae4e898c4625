// Thread-block clusters (sm_90): the CTA's rank in its cluster, the cluster-wide barrier,
// addresses in a peer CTA's shared memory (distributed shared memory), stores into it and
// mbarrier arrivals on it, and the cluster-scope wait that makes a peer's stores visible.
// PTX ISA sections: "mapa", "barrier.cluster", "st" (.shared::cluster), "mbarrier.arrive"
// (.release.cluster), "mbarrier.try_wait" (.acquire.cluster).
#pragma once
#include <cstdint>

namespace csattn::cuda {

__device__ __forceinline__ unsigned cluster_ctarank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// Every thread of every CTA of the cluster: shared-memory writes before it (and mbarrier
// initialisations fenced with fence.mbarrier_init) are visible to the whole cluster after it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The shared::cluster address of the location at shared::cta address `addr` in CTA `rank`.
__device__ __forceinline__ std::uint32_t cluster_map(std::uint32_t addr, unsigned rank) {
  std::uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
// The generic address of `p` (this CTA's shared memory) in CTA `rank`: ordinary loads through
// it read the peer's shared memory.
template <class T>
__device__ __forceinline__ const T* cluster_map(const T* p, unsigned rank) {
  std::uint64_t r;
  asm volatile("mapa.u64 %0, %1, %2;\n" : "=l"(r) : "l"(reinterpret_cast<std::uint64_t>(p)), "r"(rank));
  return reinterpret_cast<const T*>(r);
}

// 16 bytes into (possibly another CTA's) shared memory at a shared::cluster address.
__device__ __forceinline__ void st_cluster_v4(std::uint32_t addr, float a, float b, float c, float d) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(a), "f"(b),
               "f"(c), "f"(d)
               : "memory");
}
__device__ __forceinline__ float4 ld_shared_v4(std::uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// One arrival on the mbarrier at shared::cluster address `bar` (another CTA's), ordered after
// this thread's earlier memory operations at cluster scope (release): what it stored there is
// visible to a thread that sees the phase complete with mbar_wait_cluster.
__device__ __forceinline__ void mbar_arrive_cluster(std::uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// mbar_wait (wgmma_sync.cuh) with cluster-scope acquire: the arrivals' earlier stores from other
// CTAs of the cluster are visible after it.
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

}  // namespace csattn::cuda
