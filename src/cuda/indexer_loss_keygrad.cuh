// Where the indexer loss puts the gradient of one candidate's key (dL/dK^I_j, fp32): the one
// seam between the loss kernels and the key-gradient accumulation. Today: fp32 vector atomics
// into dkeys_acc [Nc, D_I] (the order of the adds between rows is not fixed, so dkeys is
// not bitwise repeatable). A deterministic mode replaces only this function: it has the query
// row and the candidate's slot in that row, enough to write a per-(row, candidate)
// contribution to a scratch that a fixed-order pass sums afterwards.
#pragma once
#include "cuda/params.hpp"

namespace csattn::cuda {

struct KeyGradSink {
  float* acc = nullptr;  // [Nc, D_I]
  int dim = 0;           // D_I
};

// v0, v1: dims (dim, dim + 1) of candidate `slot` of query row t, whose key is compressed
// row `key_row` (batch-global). `dim` is even.
__device__ __forceinline__ void add_key_grad(const KeyGradSink& s, int t, int slot, long key_row,
                                             int dim, float v0, float v1) {
  (void)t;
  (void)slot;
  atomicAdd(reinterpret_cast<float2*>(s.acc + key_row * s.dim + dim), make_float2(v0, v1));
}

}  // namespace csattn::cuda
