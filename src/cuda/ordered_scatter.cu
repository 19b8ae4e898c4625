// The fixed-order scatter-add of the deterministic backward (see ordered_scatter.hpp).
// One warp per destination key row: the warp tests 32 rows of the chunk at a time for a
// reference to its key (the same formulas as the producer's key list), then adds the found
// contributions in ascending row order, each lane owning width/32 floats. A key row is owned
// by one warp per launch, so the final add is a plain read-modify-write.
#include <algorithm>
#include <string>

#include "cuda/check.hpp"
#include "cuda/device_util.cuh"
#include "cuda/ordered_scatter.hpp"

namespace csattn::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// Position of segment-local id j in a top-k row (valid ids first, ascending, then -1), or -1.
__device__ __forceinline__ int find_in_topk(const std::int32_t* sel, int K, int j) {
  int lo = 0, hi = K;  // first k with sel[k] < 0 || sel[k] >= j
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    const int v = sel[mid];
    if (v >= 0 && v < j) lo = mid + 1; else hi = mid;
  }
  return lo < K && sel[lo] == j ? lo : -1;
}

// The floats of one contribution a lane owns. Widths that are multiples of 128 (every
// DeepSeek-V4 shape) go as kVec float4s per lane; other multiples of 32 (small test and
// sliced shapes) as kVec scalars per lane, element lane + 32 i, guarded by the width.
template <int kVec, bool kFloat4>
struct LaneSlice {
  static constexpr int kFloats = kFloat4 ? 4 * kVec : kVec;
  float v[kFloats];

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < kFloats; ++i) v[i] = 0.0f;
  }
  // v += row (or, with `store`, row += v and write back).
  __device__ __forceinline__ void add_from(const float* row, int width) {
    const int lane = threadIdx.x & 31;
    if constexpr (kFloat4) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float4 x = reinterpret_cast<const float4*>(row)[lane + 32 * i];
        v[4 * i] += x.x;
        v[4 * i + 1] += x.y;
        v[4 * i + 2] += x.z;
        v[4 * i + 3] += x.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i)
        if (lane + 32 * i < width) v[i] += row[lane + 32 * i];
    }
  }
  __device__ __forceinline__ void add_into(float* row, int width) const {
    const int lane = threadIdx.x & 31;
    if constexpr (kFloat4) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        float4* p = reinterpret_cast<float4*>(row) + lane + 32 * i;
        float4 x = *p;
        x.x += v[4 * i];
        x.y += v[4 * i + 1];
        x.z += v[4 * i + 2];
        x.w += v[4 * i + 3];
        *p = x;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i)
        if (lane + 32 * i < width) row[lane + 32 * i] += v[i];
    }
  }
};

template <class Slice>
__device__ __forceinline__ void add_found(unsigned found, int slot, int base, int r0, int slots,
                                          int copies, int width, const float* scratch, Slice& acc) {
  while (found) {
    const int src = __ffs(found) - 1;  // ascending rows
    found &= found - 1;
    const int s = __shfl_sync(0xffffffffu, slot, src);
    for (int c = 0; c < copies; ++c) {
      const long off = ((static_cast<long>(base + src - r0) * copies + c) * slots + s) * width;
      acc.add_from(scratch + off, width);
    }
  }
}

// Two CTAs an SM, except with 32-float slices (widths past 256 other than 384 and 512, e.g.
// 640), which spilled under that cap's 128 registers (148 used now).
template <int kVec, bool kFloat4>
__global__ void __launch_bounds__(kThreads, kVec >= 32 ? 1 : 2)
    ordered_scatter_kernel(LayerDims d, DeviceMetadata meta, const std::int32_t* topk,
                           OrderedScatter s, int r0, int rows, int window_lo, int window_targets,
                           int comp_targets, const float* scratch) {
  const int lane = threadIdx.x & 31;
  const int target = blockIdx.x * kWarps + (threadIdx.x >> 5);
  // The last block's spare warps (and, with no compressed destination, every warp past the
  // window rows: comp_targets is 0 then) have no target.
  if (target >= window_targets + comp_targets) return;
  const int r_end = r0 + rows;
  LaneSlice<kVec, kFloat4> acc;
  acc.zero();
  bool any = false;
  float* dst = nullptr;

  if (target < window_targets) {
    // A raw key row u: referenced by rows r in [u, u + W) of its own segment.
    const int u = window_lo + target;
    dst = s.dst_window + static_cast<long>(u) * s.width;
    const int lo = max(u, r0), hi = min(u + d.window, r_end);
    for (int base = lo; base < hi; base += 32) {
      const int r = base + lane;
      int slot = -1;
      if (r < hi) {
        const int first = query_window(d, meta, meta.row_segment[r], meta.row_position[r]).row0;
        if (first <= u) slot = u - first;
      }
      const unsigned found = __ballot_sync(0xffffffffu, slot >= 0);
      any |= found != 0u;
      add_found(found, slot, base, r0, s.slots, s.copies, s.width, scratch, acc);
    }
  } else {
    // A compressed row c = comp_start[b] + j: rows of segment b that selected / see entry j.
    const int c = target - window_targets;  // < comp_capacity
    if (c >= meta.comp_start[d.segments]) return;  // a capacity row without an entry
    const int b = compressed_segment(meta.comp_start, d.segments, c);
    const int j = c - meta.comp_start[b];
    const int entries = meta.comp_start[b + 1] - meta.comp_start[b];
    dst = s.dst_comp + static_cast<long>(c) * s.width;
    const int lo = max(r0, meta.cu_padded[b]), hi = min(r_end, meta.cu_padded[b + 1]);
    for (int base = lo; base < hi; base += 32) {
      const int r = base + lane;
      int slot = -1;
      if (r < hi) {
        const int pos = meta.row_position[r];
        const bool attention = s.layout == SlotLayout::attention;
        const int n_win = attention ? query_window(d, meta, b, pos).n : 0;
        if (attention || !meta.row_is_padding[r]) {
          if (s.layout == SlotLayout::loss_sparse || (attention && d.ratio == 4)) {
            const int k = find_in_topk(topk + static_cast<long>(r) * d.topk, d.topk, j);
            if (k >= 0) slot = n_win + k;
          } else if (j < min((pos + 1) / d.ratio, entries)) {
            slot = n_win + j;
          }
        }
      }
      const unsigned found = __ballot_sync(0xffffffffu, slot >= 0);
      any |= found != 0u;
      add_found(found, slot, base, r0, s.slots, s.copies, s.width, scratch, acc);
    }
  }
  if (any) acc.add_into(dst, s.width);
}

}  // namespace

int scatter_chunk_rows(int rows, int slots, int width, std::size_t budget_bytes) {
  const std::size_t per_row = sizeof(float) * static_cast<std::size_t>(std::max(slots, 1)) *
                              static_cast<std::size_t>(std::max(width, 1));
  const std::size_t fit = std::max<std::size_t>(1, budget_bytes / per_row);
  return static_cast<int>(std::min<std::size_t>(fit, static_cast<std::size_t>(std::max(rows, 1))));
}

void launch_ordered_scatter(const LayerDims& d, const DeviceMetadata& meta,
                            const std::int32_t* topk, const OrderedScatter& s, int r0, int rows,
                            const float* scratch, cudaStream_t stream) {
  if (rows <= 0) return;
  require(s.width > 0 && s.width % 32 == 0 && s.width <= 1024, ErrorKind::Unsupported,
          "ordered scatter: width must be a multiple of 32 up to 1024, got " + std::to_string(s.width));
  const bool window = s.layout == SlotLayout::attention && d.window > 0;
  const int window_lo = window ? std::max(0, r0 - d.window + 1) : 0;
  const int window_targets = window ? std::min(r0 + rows, d.rows) - window_lo : 0;
  const int comp_targets = d.ratio > 1 && s.dst_comp != nullptr ? d.comp_capacity : 0;
  const long targets = static_cast<long>(window_targets) + comp_targets;
  if (targets <= 0) return;
  const unsigned blocks = static_cast<unsigned>((targets + kWarps - 1) / kWarps);
  auto launch = [&](auto kernel) {
    kernel<<<blocks, kThreads, 0, stream>>>(d, meta, topk, s, r0, rows, window_lo, window_targets, comp_targets,
                                            scratch);
  };
  if (s.width % 128 == 0 && s.width <= 512) {
    switch (s.width / 128) {
      case 1: launch(ordered_scatter_kernel<1, true>); break;
      case 2: launch(ordered_scatter_kernel<2, true>); break;
      case 3: launch(ordered_scatter_kernel<3, true>); break;
      default: launch(ordered_scatter_kernel<4, true>); break;
    }
  } else if (s.width <= 64) {
    launch(ordered_scatter_kernel<2, false>);
  } else if (s.width <= 256) {
    launch(ordered_scatter_kernel<8, false>);
  } else {
    launch(ordered_scatter_kernel<32, false>);
  }
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
