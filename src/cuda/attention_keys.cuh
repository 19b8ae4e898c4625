// The key list of one query, shared by the attention kernels: window rows first (raw kv row
// r >= 0), then compressed rows encoded as -(row + 1): HCA all visible entries, CSA the valid
// ids of the top-k row in their order. build_key_list stores the whole list (shared memory
// grows with it: HCA segments of ~1M tokens have ~8K keys); KeyList derives a slot's id from
// the row's metadata and keeps only the compacted CSA selection. The fast kernels take
// KeyList (the wgmma forward's producer compacts with the same compact_valid_ids); the
// CUDA-core references and the mma.sync fallbacks keep the stored list on purpose: the
// kernel tests compare the two derivations of one list.
#pragma once
#include "cuda/device_util.cuh"
#include "cuda/params.hpp"

namespace csattn::cuda {

__device__ __forceinline__ const bf16* key_row_ptr(int id, const bf16* kv, const bf16* comp, int D) {
  return id >= 0 ? kv + static_cast<long>(id) * D : comp + static_cast<long>(-id - 1) * D;
}
// The fp32 gradient row of the same key: the raw kv rows' or the compressed rows' accumulator.
__device__ __forceinline__ float* key_grad_row(int id, float* dkv, float* dcomp, int D) {
  return id >= 0 ? dkv + static_cast<long>(id) * D : dcomp + static_cast<long>(-id - 1) * D;
}

// Called by every thread of the block; returns the count after a __syncthreads.
__device__ __forceinline__ int build_key_list(const LayerDims& d, const DeviceMetadata& meta,
                                              const std::int32_t* topk, int t, int* ids,
                                              int* shared_count) {
  const int b = meta.row_segment[t], pos = meta.row_position[t];
  const QueryWindow win = query_window(d, meta, b, pos);
  const int n_win = win.n;
  if (d.ratio == 4) {
    if (threadIdx.x == 0) {
      int c = 0;
      const std::int32_t* sel = topk + static_cast<long>(t) * d.topk;
      for (int k = 0; k < d.topk; ++k)
        if (sel[k] >= 0) ids[n_win + c++] = -(meta.comp_start[b] + sel[k] + 1);
      *shared_count = n_win + c;
    }
  } else {
    const int n_comp = d.ratio > 1 ? min((pos + 1) / d.ratio, meta.comp_start[b + 1] - meta.comp_start[b]) : 0;
    for (int j = threadIdx.x; j < n_comp; j += blockDim.x) ids[n_win + j] = -(meta.comp_start[b] + j + 1);
    if (threadIdx.x == 0) *shared_count = n_win + n_comp;
  }
  for (int i = threadIdx.x; i < n_win; i += blockDim.x) ids[i] = win.row0 + i;
  __syncthreads();
  return *shared_count;
}


// A query's key list without storing it: slot s < n_win is raw kv row win_row0 + s; slot
// n_win + j is compressed row comp_row0 + (sel ? sel[j] : j), sel holding the valid entries
// of a CSA top-k row in order (shared memory), HCA taking every visible entry in order.
struct KeyList {
  int n_win = 0, n = 0, win_row0 = 0, comp_row0 = 0;
  const int* sel = nullptr;
  __device__ __forceinline__ int id(int slot) const {
    if (slot < n_win) return win_row0 + slot;
    const int j = slot - n_win;
    return -(comp_row0 + (sel != nullptr ? sel[j] : j) + 1);
  }
};

// The entries of sel[0 .. K) that keep(id) accepts, in their order, into out; returns their
// count. Called by the kThreads threads (tid = threadIdx.x, warps 0 .. kThreads / 32 - 1)
// that sync() synchronises - a block or a named barrier; warp_counts: [kThreads / 32] ints of
// shared memory. kBatch entries a thread per round (one global round trip per
// kBatch x kThreads entries), a ballot and a scan over the warps' counts per entry.
template <int kThreads, class Sync, class Keep>
__device__ __forceinline__ int compact_ids_if(const std::int32_t* sel, int K, int* out,
                                              int* warp_counts, Sync sync, Keep keep) {
  constexpr int kBatch = 4;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int total = 0;
  for (int base = 0; base < K; base += kBatch * kThreads) {
    int v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int k = base + j * kThreads + tid;
      v[j] = k < K ? sel[k] : -1;
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (base + j * kThreads >= K) break;  // uniform
      const bool ok = base + j * kThreads + tid < K && keep(v[j]);
      const unsigned ballot = __ballot_sync(0xffffffffu, ok);
      if (lane == 0) warp_counts[warp] = __popc(ballot);
      sync();
      int before = 0, all = 0;
      for (int w = 0; w < kThreads / 32; ++w) {
        const int c = warp_counts[w];
        before += w < warp ? c : 0;
        all += c;
      }
      if (ok) out[total + before + __popc(ballot & ((1u << lane) - 1u))] = v[j];
      total += all;
      sync();  // warp_counts is rewritten next; out complete after the last
    }
  }
  return total;
}

// The valid (>= 0) ids: the top-k contract's selection, -1 where a row has fewer.
template <int kThreads, class Sync>
__device__ __forceinline__ int compact_valid_ids(const std::int32_t* sel, int K, int* out,
                                                 int* warp_counts, Sync sync) {
  return compact_ids_if<kThreads>(sel, K, out, warp_counts, sync, [](int id) { return id >= 0; });
}

// The KeyList of row t. Called by every thread of a block of kThreads threads; for CSA it
// compacts the top-k row into sel_s ([topk] ints of shared memory, compact_valid_ids with
// warp_counts: [kThreads / 32] ints of shared memory); ends with a __syncthreads.
template <int kThreads>
__device__ __forceinline__ KeyList make_key_list(const LayerDims& d, const DeviceMetadata& meta,
                                                 const std::int32_t* topk, int t, int* sel_s,
                                                 int* warp_counts) {
  KeyList k;
  const int b = meta.row_segment[t], pos = meta.row_position[t];
  const QueryWindow win = query_window(d, meta, b, pos);
  k.n_win = win.n;
  k.win_row0 = win.row0;
  k.comp_row0 = d.ratio > 1 ? meta.comp_start[b] : 0;
  int n_comp = 0;
  if (d.ratio == 4) {
    n_comp = compact_valid_ids<kThreads>(topk + static_cast<long>(t) * d.topk, d.topk, sel_s,
                                         warp_counts, [] { __syncthreads(); });
    k.sel = sel_s;
  } else if (d.ratio > 1) {
    n_comp = min((pos + 1) / d.ratio, meta.comp_start[b + 1] - meta.comp_start[b]);
  }
  k.n = k.n_win + n_comp;
  __syncthreads();
  return k;
}

}  // namespace csattn::cuda
