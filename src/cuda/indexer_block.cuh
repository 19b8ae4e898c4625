// The frame the two multi-row indexers share (indexer_topk_tiled.cu: mma.sync,
// indexer_topk_wgmma.cu: wgmma): persistent CTAs take blocks of kIdxTiledRows consecutive
// query rows by ticket, the longest rows first; rows with n <= K get every visible id at
// once; the others are scored in runs (one per segment among the block's rows, a block
// crossing a segment boundary has several) into the CTA's score slot with the first radix
// digit's histogram, then selected by the radix select. Only the scoring differs.
#pragma once
#include <algorithm>
#include <cstdint>

#include "cuda/check.hpp"
#include "cuda/indexer_select.cuh"
#include "cuda/indexer_topk_plan.hpp"
#include "cuda/params.hpp"

namespace csattn::cuda::idxblock {

constexpr int kRows = kIdxTiledRows;

struct Shared {  // in the CTA's static shared memory
  int ticket;
  int seg[kRows];  // the rows' segments (-1 past the batch)
  int n[kRows];    // their visible compressed keys
};

__device__ __forceinline__ int visible(const LayerDims& d, const DeviceMetadata& meta, int t, int b) {
  const int seg_entries = meta.comp_start[b + 1] - meta.comp_start[b];
  return meta.row_is_padding[t] ? 0 : min((meta.row_position[t] + 1) / d.ratio, seg_entries);
}

// Block `ticket`'s first row: the tickets go to the longest rows first (a short tail).
__device__ __forceinline__ int block_first_row(const LayerDims& d, int ticket) {
  const int blocks = (d.rows + kRows - 1) / kRows;
  return (blocks - 1 - ticket) * kRows;
}

// Thread tid < kRows records row t0 + tid's segment and visible count in sh (the caller's
// barrier follows).
__device__ __forceinline__ void block_rows(const LayerDims& d, const DeviceMetadata& meta, int tid, int t0,
                                           Shared& sh) {
  if (tid < kRows) {
    const int t = t0 + tid;
    sh.seg[tid] = t < d.rows ? meta.row_segment[t] : -1;
    sh.n[tid] = t < d.rows ? visible(d, meta, t, sh.seg[tid]) : 0;
  }
}

// After block_rows and a barrier: the rows with n <= K written at once (ids 0..n-1, then -1)
// by the kThreads threads from tid, and the mask of the rows left to score and select.
template <int kThreads>
__device__ __forceinline__ unsigned block_todo(const LayerDims& d, int tid, int t0, const Shared& sh,
                                               std::int32_t* topk) {
  const int K = d.topk;
  unsigned todo = 0;
  for (int i = 0; i < kRows; ++i)
    if (sh.n[i] > K) todo |= 1u << i;
  for (int i = 0; i < kRows; ++i) {
    if (t0 + i >= d.rows || (todo >> i & 1u)) continue;
    std::int32_t* out = topk + static_cast<long>(t0 + i) * K;
    for (int k = tid; k < K; k += kThreads) out[k] = k < sh.n[i] ? k : -1;
  }
  return todo;
}

// Takes the CTA's next block (false, for every thread, when none is left). Otherwise t0 is
// its first row, sh.seg / sh.n hold its rows, the rows' histograms ([kRows, kBins]) are zero,
// the rows with n <= K are written (ids 0..n-1, then -1), and the result mask has the rows
// left to score and select.
template <int kThreads>
__device__ bool next_block(const LayerDims& d, const DeviceMetadata& meta, unsigned* counter,
                           std::int32_t* topk, unsigned* hist, Shared& sh, int& t0, unsigned& todo) {
  const int tid = threadIdx.x;
  const int blocks = (d.rows + kRows - 1) / kRows;
  if (tid == 0) sh.ticket = static_cast<int>(atomicAdd(counter, 1u));
  __syncthreads();
  const int ticket = sh.ticket;
  if (ticket >= blocks) return false;
  t0 = block_first_row(d, ticket);
  block_rows(d, meta, tid, t0, sh);
  for (int i = tid; i < kRows * idxsel::kBins; i += kThreads) hist[i] = 0u;
  __syncthreads();
  todo = block_todo<kThreads>(d, tid, t0, sh, topk);
  return true;
}

// The next run of `todo` (the rows of its first row's segment), removed from todo; n_run is
// the run's largest visible count.
__device__ __forceinline__ unsigned take_run(unsigned& todo, const Shared& sh, int& seg, int& n_run) {
  seg = sh.seg[__ffs(todo) - 1];
  unsigned run = 0;
  n_run = 0;
  for (int i = 0; i < kRows; ++i)
    if ((todo >> i & 1u) && sh.seg[i] == seg) {
      run |= 1u << i;
      n_run = max(n_run, sh.n[i]);
    }
  todo &= ~run;
  return run;
}

// After the scoring: the radix select of every row in `selecting` from its scores in the
// slot (row stride row_stride) and its histogram. kByRows false: the rows one after another,
// each by the whole CTA (sel[0]; the tiled kernel, which has no registers for the other);
// kByRows true: side by side, row i by threads [i kThreads / kRows, (i + 1) kThreads / kRows)
// with sel[i] and their own named barrier - a select is a chain of barriers and L2 reads
// (four passes over the row's scores), so four of them overlap where one CTA-wide select
// waits alone (the wgmma kernel). Both give the same ids. kByRows only: where `stage` is
// given (shared memory the scoring no longer uses, stage_floats per row, a multiple of 4), a
// row of at most stage_floats scores is first copied there in one pass, and the select's
// four passes read shared memory instead of L2 (the wgmma kernel: rows of up to 10240
// candidates at index dim 128, 5120 at 64).
// kScores (kByRows only, the wgmma kernel): the selected ids' scores too, row t's k-th at
// scores_out[(t * K + k) * score_stride] (the rows selected here: n > K).
template <int kThreads, bool kByRows, bool kScores = false>
__device__ void select_block(const LayerDims& d, unsigned selecting, const Shared& sh, int t0,
                             const float* slot, long row_stride, unsigned* hist,
                             idxsel::SelectShared* sel, std::int32_t* topk,
                             float* stage = nullptr, int stage_floats = 0,
                             float* scores_out = nullptr, int score_stride = 1) {
  __syncthreads();  // scores and histograms complete
  if constexpr (kByRows) {
    static_assert(kThreads % (32 * kRows) == 0, "whole warps per row");
    using G = idxsel::RowGroup<kThreads / kRows>;
    const int i = static_cast<int>(threadIdx.x) / G::kThreads;
    if (selecting >> i & 1u) {
      const float* scores = slot + i * row_stride;
      const int n = sh.n[i];
      const bool staged = stage != nullptr && n <= stage_floats;
      if (staged) {
        float4* mine = reinterpret_cast<float4*>(stage + static_cast<long>(i) * stage_floats);
        const float4* from = reinterpret_cast<const float4*>(scores);
        const int n4 = (n + 3) / 4;
        // Four loads in flight a thread before their stores.
        idxsel::for_each_float4<4>(from, G::tid(), n4, G::kThreads, [&](int j, const float4& v) { mine[j] = v; });
        G::sync();
        scores = reinterpret_cast<const float*>(mine);
      }
      idxsel::select_topk_radix<G, kScores>(
          scores, n, d.topk, hist + i * idxsel::kBins, sel[i], topk + static_cast<long>(t0 + i) * d.topk, staged,
          kScores ? scores_out + static_cast<long>(t0 + i) * d.topk * score_stride : nullptr,
          kScores ? score_stride : 1);
    }
    __syncthreads();  // every row's select is done with hist, sel and stage before the next block
  } else {
    for (int i = 0; i < kRows; ++i) {
      if (!(selecting >> i & 1u)) continue;
      idxsel::select_topk_radix<idxsel::BlockThreads<kThreads>>(slot + i * row_stride, sh.n[i], d.topk,
                                                                hist + i * idxsel::kBins, sel[0],
                                                                topk + static_cast<long>(t0 + i) * d.topk);
    }
  }
}

// The parameters both kernels start with, and their common launch (host): a persistent grid
// of at most ctas_per_sm CTAs per SM (and no more than the scratch's kIdxTiledMaxCtas
// slots), the scratch split into the ticket counter (zeroed here) and the CTAs' score slots
// (one a CTA; the overlapped wgmma kernel takes two, so its launcher requires at most half
// as many SMs as slots). `extra` arguments follow those (the wgmma kernels' tensor map...).
template <class... Extra>
inline void launch_block_kernel(void (*kernel)(LayerDims, DeviceMetadata, const bf16*, const float*,
                                               const bf16*, std::int32_t*, unsigned*, float*, long,
                                               Extra...),
                                int threads, int ctas_per_sm, std::size_t smem, const char* what,
                                const LayerDims& d, const DeviceMetadata& meta, const bf16* qi,
                                const float* w_eff, const bf16* keys, std::int32_t* topk,
                                void* scratch, cudaStream_t stream, Extra... extra) {
  const int blocks = (d.rows + kRows - 1) / kRows;
  const int grid = std::min({blocks, ctas_per_sm * multiprocessor_count(), kIdxTiledMaxCtas});
  allow_dynamic_smem(kernel, smem, what);
  unsigned* counter = static_cast<unsigned*>(scratch);
  float* slots = reinterpret_cast<float*>(static_cast<unsigned char*>(scratch) + kIdxTiledHeaderBytes);
  CSATTN_CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof(unsigned), stream));
  kernel<<<grid, threads, smem, stream>>>(d, meta, qi, w_eff, keys, topk, counter, slots,
                                          static_cast<long>(indexer_tiled_row_stride(d)), extra...);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda::idxblock
