// Where the indexer loss puts the gradient of one candidate's key (dL/dK^I_j, fp32): the one
// seam between the loss kernels and the key-gradient accumulation. Fast mode: fp32 vector
// atomics into dkeys_acc [Nc, D_I] (the order of the adds between rows is not fixed).
// Deterministic mode (scratch set): a plain store of the row's own contribution into the
// chunk's scratch [rows, slots, D_I] (slot = the candidate's position in the row), which
// launch_ordered_scatter then sums per key in row order (grad_chunk.hpp).
#pragma once
#include "cuda/params.hpp"

namespace csattn::cuda {

struct KeyGradSink {
  float* acc = nullptr;  // [Nc, D_I]
  int dim = 0;           // D_I
  float* scratch = nullptr;  // deterministic mode: [rows of the chunk, slots, D_I]
  int r0 = 0, slots = 0;
};

// v0, v1: dims (dim, dim + 1) of candidate `slot` of query row t, whose key is compressed
// row `key_row` (batch-global). `dim` is even.
__device__ __forceinline__ void add_key_grad(const KeyGradSink& s, int t, int slot, long key_row,
                                             int dim, float v0, float v1) {
  if (s.scratch) {
    *reinterpret_cast<float2*>(s.scratch + (static_cast<long>(t - s.r0) * s.slots + slot) * s.dim + dim) =
        make_float2(v0, v1);
    return;
  }
  atomicAdd(reinterpret_cast<float2*>(s.acc + key_row * s.dim + dim), make_float2(v0, v1));
}

}  // namespace csattn::cuda
