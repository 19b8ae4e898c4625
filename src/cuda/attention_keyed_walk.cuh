// The key-stationary compressed-row pass's walk (attention_backward_keyed_wgmma.cu; the host
// side in attention_backward_keyed.cu): a CTA owns a block of consecutive compressed
// entries e0 .. and a chunk of query rows [r_lo, r_hi), and visits the (row, head block)
// tiles that see any of its entries in one fixed order.
#pragma once
#include "cuda/device_util.cuh"
#include "cuda/params.hpp"

namespace csattn::cuda {

// The walk's position: segment b of the block's entries, row t, head block hb. next() steps
// in the fixed order (rows ascending within a segment, head blocks within a row, segments
// ascending); done once past the last segment.
struct Walk {
  int b, b_last, t, t_end, hb;
};

__device__ __forceinline__ void seek_segment(Walk& w, const LayerDims& d, const DeviceMetadata& m,
                                             int e0, int r_lo, int r_hi) {
  // (r_hi <= d.rows: a run's cu_padded end may lie past the rows that exist.)
  for (; w.b <= w.b_last; ++w.b) {
    // The block's first entry in segment b, segment-local: rows at positions before the
    // first one that sees it see none of the block's entries of b. Found by binary search
    // over the run's rows (positions ascend along them), not by arithmetic: the kernels'
    // contract lets the query rows be a subset of the run's positions (attention_keys.cuh).
    const int j0 = max(e0, m.comp_start[w.b]) - m.comp_start[w.b];
    const int need = (j0 + 1) * d.ratio - 1;
    int lo = max(m.cu_padded[w.b], r_lo), hi = min(m.cu_padded[w.b + 1], r_hi);
    w.t_end = hi;
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (m.row_position[mid] < need) lo = mid + 1; else hi = mid;
    }
    w.t = lo;
    w.hb = 0;
    if (w.t < w.t_end) return;
  }
}

__device__ __forceinline__ void next_tile(Walk& w, const LayerDims& d, const DeviceMetadata& m,
                                          int e0, int r_lo, int r_hi, int head_blocks) {
  if (++w.hb < head_blocks) return;
  w.hb = 0;
  if (++w.t < w.t_end) return;
  ++w.b;
  seek_segment(w, d, m, e0, r_lo, r_hi);
}

// The CTA's share of the grid (blockIdx = chunk * key_blocks + key block): its first entry
// e0 (a block of `entries`), the run's entry count, and its chunk's query rows [r_lo, r_hi).
// e0 >= total: capacity rows without an entry, nothing to do (nobody reads their partials).
struct KeyedCta {
  int c, e0, total, r_lo, r_hi;
};
__device__ __forceinline__ KeyedCta keyed_cta(const LayerDims& d, const DeviceMetadata& m, int key_blocks,
                                              int chunk_rows, int entries) {
  KeyedCta k;
  k.c = static_cast<int>(blockIdx.x / key_blocks);
  k.e0 = static_cast<int>(blockIdx.x % key_blocks) * entries;
  k.total = m.comp_start[d.segments];
  k.r_lo = k.c * chunk_rows;
  k.r_hi = min(d.rows, k.r_lo + chunk_rows);
  return k;
}

// The walk's first tile: the segments holding the block's entries, the first row of the
// first of them that sees one (done at once if no row of the chunk does).
__device__ __forceinline__ Walk start_walk(const LayerDims& d, const DeviceMetadata& m, const KeyedCta& k,
                                           int entries) {
  Walk w{compressed_segment(m.comp_start, d.segments, k.e0),
         compressed_segment(m.comp_start, d.segments, min(k.e0 + entries, k.total) - 1), 0, 0, 0};
  seek_segment(w, d, m, k.e0, k.r_lo, k.r_hi);
  return w;
}

// The block's entries row w.t sees, as local indices [lo, hi): those of segment w.b with
// j < (position + 1) / ratio (the key list of attention_keys.cuh).
__device__ __forceinline__ void visible_entries(const Walk& w, const LayerDims& d, const DeviceMetadata& m,
                                                int e0, int entries, int& lo, int& hi) {
  const int cs = m.comp_start[w.b];
  lo = max(0, cs - e0);
  hi = min(min(entries, m.comp_start[w.b + 1] - e0), cs + (m.row_position[w.t] + 1) / d.ratio - e0);
}

}  // namespace csattn::cuda
