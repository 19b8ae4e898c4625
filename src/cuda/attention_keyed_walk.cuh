// The key-stationary compressed-row passes' walk (attention_backward_keyed.cu on mma.sync,
// attention_backward_keyed_wgmma.cu on wgmma): a CTA owns a block of consecutive compressed
// entries e0 .. and a chunk of query rows [r_lo, r_hi), and visits the (row, head block)
// tiles that see any of its entries in one fixed order.
#pragma once
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

}  // namespace csattn::cuda
