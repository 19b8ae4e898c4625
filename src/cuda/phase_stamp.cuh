// Measurement only: the phase stamps of the wgmma kernels (the forward's run-time branch, the
// backward's and indexer's measurement instances; layouts:
// AttentionForwardStamps in kernels.hpp, AttentionBackwardStamps in backward_kernels.hpp,
// IndexerStamps in indexer_topk_tiled.hpp; read by bench/cuda_bench_phases.cpp).
#pragma once

namespace csattn::cuda {

// The first thread of each warpgroup of CTAs below kCtas writes the multiprocessor's 32-bit
// clock() with its lowest bit set (0 stays "not reached") at
// stamps[((cta * kGroups + warpgroup) * kRows + row) * kPhases + phase]. The CTA and thread
// ids are re-read at each stamp (volatile): kept live across a kernel's loops they took
// registers the attention forward's consumers do not have (ptxas spilled and serialised
// their wgmmas).
template <int kCtas, int kGroups, int kRows, int kPhases>
__device__ __forceinline__ void write_phase_stamp(unsigned* stamps, int row, int phase) {
  unsigned cta, thread;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(cta));
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(thread));
  // Warpgroups past kGroups (a block grown without its layout) write nothing.
  if ((thread & 127u) == 0u && cta < static_cast<unsigned>(kCtas) &&
      thread / 128u < static_cast<unsigned>(kGroups))
    stamps[((cta * kGroups + thread / 128u) * kRows + row) * kPhases + phase] =
        static_cast<unsigned>(clock()) | 1u;
}

}  // namespace csattn::cuda
