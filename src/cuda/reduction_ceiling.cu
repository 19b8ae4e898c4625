// The reduction ceilings of reduction_ceiling.hpp. Every kernel walks the same tiles (64 row
// ids each, a CTA per tile at a time, grid-strided) and adds 1.0f to all 512 floats of each
// row once per tile, so the benchmark can check the buffer's sum exactly (integer counts).
#include "cuda/reduction_ceiling.hpp"

#include "cuda/atomic_util.cuh"
#include "cuda/check.hpp"
#include "cuda/mma_util.cuh"

namespace csattn::cuda {

namespace {

constexpr int kTileRows = 64, kWidth = 512, kThreads = 256;
constexpr int kPieceFloats = 128;  // bulk_shared: one 512-byte piece of a row per thread
constexpr int kCtasPerSm = 4;

// flush_dk's addresses (attention_backward_wgmma.cu) after its lane-pair swap: warpgroup c
// holds dims [256 c, +256) in two 128-dim chunks; in a chunk, lane (g, q) of warp w adds four
// dims 8 i + 4 (q / 2) .. + 3 of row 16 w + g (+ 8 for odd q), i < 16.
template <bool kStore>
__global__ void __launch_bounds__(kThreads) flush_layout_kernel(float* dst, const std::int32_t* ids, int tiles) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3, c = threadIdx.x >> 7;
  const int g = lane >> 2, qd = lane & 3;
  const int slot = 16 * w + g + ((qd & 1) != 0 ? 8 : 0);
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    float* row = dst + static_cast<long>(ids[static_cast<long>(t) * kTileRows + slot]) * kWidth +
                 256 * c + 2 * (qd & ~1);
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        float* p = row + 128 * j + 8 * i;
        if (kStore)
          *reinterpret_cast<float4*>(p) = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
        else
          red_add_v4(p, 1.0f, 1.0f, 1.0f, 1.0f);
      }
  }
}

// A warp instruction on 4 rows x 128 contiguous bytes: warp v takes rows 8 v .. 8 v + 7, lane l
// dims 4 (l % 8) + 32 k of row 8 v + 4 r + l / 8. kHinted: the rows below keep_rows added at
// L2 priority evict_last, the others by the plain instruction. Two instructions, each lane
// predicated onto one: the cache policy lives in a uniform register (SASS: R2UR into the
// access's descriptor), so a policy that differs between a warp's lanes would be one lane's
// for all of them - which is what the eighteenth session's first try did.
template <bool kHinted>
__global__ void __launch_bounds__(kThreads) row_major_kernel(float* dst, const std::int32_t* ids, int tiles,
                                                             int keep_rows) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int slot = 8 * warp + 4 * r + (lane >> 3);
      const int id = ids[static_cast<long>(t) * kTileRows + slot];
      float* row = dst + static_cast<long>(id) * kWidth + 4 * (lane & 7);
      const bool keep = kHinted && id < keep_rows;
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        if (keep)
          red_add_v4_hinted(row + 32 * k, 1.0f, 1.0f, 1.0f, 1.0f, l2_policy_evict_last());
        else
          red_add_v4(row + 32 * k, 1.0f, 1.0f, 1.0f, 1.0f);
      }
    }
  }
}

// A warp instruction on 8 rows x 64 contiguous bytes: warp v takes rows 8 v .. 8 v + 7, lane l
// dims 4 (l % 4) + 16 k of row 8 v + l / 4.
__global__ void __launch_bounds__(kThreads) half_lines_kernel(float* dst, const std::int32_t* ids, int tiles) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int slot = 8 * warp + (lane >> 2);
    float* row = dst + static_cast<long>(ids[static_cast<long>(t) * kTileRows + slot]) * kWidth + 4 * (lane & 3);
#pragma unroll
    for (int k = 0; k < 32; ++k) red_add_v4(row + 16 * k, 1.0f, 1.0f, 1.0f, 1.0f);
  }
}

// Thread i issues the bulk reduction of piece i % 4 of row i / 4 of the tile, from a
// shared-memory tile of ones (written once; the TMA unit reads it through the async proxy).
// Each thread keeps at most 8 bulk groups in flight.
__global__ void __launch_bounds__(kThreads) bulk_kernel(float* dst, const std::int32_t* ids, int tiles) {
  extern __shared__ float4 ones[];  // [kTileRows x kPieceFloats] floats
  for (int i = threadIdx.x; i < kTileRows * kPieceFloats / 4; i += kThreads) ones[i] = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const int slot = threadIdx.x >> 2, piece = threadIdx.x & 3;
  const std::uint32_t src = smem_addr(ones) + slot * kPieceFloats * 4;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    float* d = dst + static_cast<long>(ids[static_cast<long>(t) * kTileRows + slot]) * kWidth + kPieceFloats * piece;
    asm volatile(
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
        "cp.async.bulk.commit_group;\n"
        "cp.async.bulk.wait_group.read 8;\n" ::"l"(d),
        "r"(src), "n"(kPieceFloats * 4)
        : "memory");
  }
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // complete before the CTA exits
}

}  // namespace

const char* reduction_path_name(ReductionPath path) {
  switch (path) {
    case ReductionPath::red_flush_layout: return "red.v4, flush_dk layout (16 rows x 32 B a warp instruction)";
    case ReductionPath::red_row_major: return "red.v4, 4 rows x 128 B a warp instruction";
    case ReductionPath::red_half_lines: return "red.v4, 8 rows x 64 B a warp instruction";
    case ReductionPath::bulk_shared: return "cp.reduce.async.bulk add.f32, 512 B pieces from shared memory";
    case ReductionPath::store_flush_layout: return "st.v4 (not a reduction), flush_dk layout";
    case ReductionPath::red_row_major_kept: return "red.v4, 4 rows x 128 B, the first rows at L2 evict_last";
  }
  return "?";
}

void launch_reduction_ceiling(ReductionPath path, float* dst, const std::int32_t* row_ids,
                              int tiles, cudaStream_t stream, int keep_rows) {
  if (tiles <= 0) return;
  const unsigned grid = static_cast<unsigned>(multiprocessor_count() * kCtasPerSm);
  switch (path) {
    case ReductionPath::red_flush_layout:
      flush_layout_kernel<false><<<grid, kThreads, 0, stream>>>(dst, row_ids, tiles);
      break;
    case ReductionPath::store_flush_layout:
      flush_layout_kernel<true><<<grid, kThreads, 0, stream>>>(dst, row_ids, tiles);
      break;
    case ReductionPath::red_row_major:
      row_major_kernel<false><<<grid, kThreads, 0, stream>>>(dst, row_ids, tiles, 0);
      break;
    case ReductionPath::red_row_major_kept:
      row_major_kernel<true><<<grid, kThreads, 0, stream>>>(dst, row_ids, tiles, keep_rows);
      break;
    case ReductionPath::red_half_lines:
      half_lines_kernel<<<grid, kThreads, 0, stream>>>(dst, row_ids, tiles);
      break;
    case ReductionPath::bulk_shared:
      bulk_kernel<<<grid, kThreads, sizeof(float) * kTileRows * kPieceFloats, stream>>>(dst, row_ids, tiles);
      break;
  }
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
