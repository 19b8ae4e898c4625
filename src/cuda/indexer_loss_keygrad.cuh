// Where the indexer loss puts the gradient of one candidate's key (dL/dK^I_j, fp32): the one
// seam between the loss kernels and the key-gradient accumulation. Fast mode: fp32 vector
// reductions of whole 128-byte lines into dkeys_acc [Nc, D_I] (the order of the adds
// between rows is not fixed).
// Deterministic mode (scratch set): a plain store of the row's own contribution into the
// chunk's scratch [rows, slots, D_I] (slot = the candidate's position in the row), which
// launch_ordered_scatter then sums per key in row order (grad_chunk.hpp).
#pragma once
#include "cuda/atomic_util.cuh"
#include "cuda/line_stage.cuh"
#include "cuda/params.hpp"

namespace csattn::cuda {

struct KeyGradSink {
  float* acc = nullptr;  // [Nc, D_I]
  int dim = 0;           // D_I
  float* scratch = nullptr;  // deterministic mode: [rows of the chunk, slots, D_I]
  int r0 = 0, slots = 0;
};

// Deterministic mode: v0, v1 are dims (dim, dim + 1) of candidate `slot` of query row t,
// stored into the chunk's scratch. `dim` is even.
__device__ __forceinline__ void store_key_grad(const KeyGradSink& s, int t, int slot, int dim, float v0,
                                               float v1) {
  *reinterpret_cast<float2*>(s.scratch + (static_cast<long>(t - s.r0) * s.slots + slot) * s.dim + dim) =
      make_float2(v0, v1);
}

// Fast mode by whole 128-byte lines (the tensor-core kernel's flush): a warp's 8 keys x 32
// dims, lane (g, q) holding dims dim0 + 8 n + 2 q (+1) of key g (the mma.sync C layout) at
// v[n], go through `stage` (line_stage.cuh: 1 KB of this warp's shared memory) and leave as
// 4 keys x 128 contiguous bytes a red.global.add.v4 instead of float2 atomics over 8 keys x
// 32 bytes an instruction: 1.5-4% faster gradient launches (perf.md fifteenth session). key_row: this lane's key
// g, -1 for none (all lanes call it; such keys add nothing). dim0: a multiple of 32 (the 128
// bytes are one aligned line).
__device__ __forceinline__ void add_key_grads_lines(const KeyGradSink& s, int key_row, int dim0,
                                                    const float2 (&v)[4], float* stage) {
  const int lane = threadIdx.x & 31;
  line_stage_rows(stage, v);
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int kr = __shfl_sync(0xffffffffu, key_row, 4 * ((lane >> 3) + 4 * k));  // -1 = none
    const float4 x = line_stage_piece(stage, k);
    if (kr >= 0) red_add_v4(s.acc + static_cast<long>(kr) * s.dim + dim0 + 4 * (lane & 7), x.x, x.y, x.z, x.w);
  }
  __syncwarp();  // the staging area is rewritten next
}

}  // namespace csattn::cuda
