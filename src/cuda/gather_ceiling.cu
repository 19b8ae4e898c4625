// launch_gather_ceiling (gather_ceiling.hpp).
#include "cuda/gather_ceiling.hpp"

#include <algorithm>
#include <string>

#include "cuda/check.hpp"
#include "cuda/mma_util.cuh"
#include "cuda/tma.hpp"
#include "cuda/wgmma_sync.cuh"

namespace csattn::cuda {

namespace {

constexpr int kThreads = 256, kTileRows = 64, kRowBytes = 1024, kStages = 3;
constexpr int kTileBytes = kTileRows * kRowBytes;
constexpr int kChunksPerThread = kTileBytes / 16 / kThreads;  // 16

// The item's Q (read once) and O (written once), 64 KB each, 16-byte accesses, into `add`.
template <class Add>
__device__ __forceinline__ void stream_item(const bf16* q, bf16* out, long item, Add&& add) {
  const uint4* qi = reinterpret_cast<const uint4*>(q + item * kTileRows * 512);
  uint4* oi = reinterpret_cast<uint4*>(out + item * kTileRows * 512);
#pragma unroll 4
  for (int k = threadIdx.x; k < kTileBytes / 16; k += kThreads) {
    add(qi[k]);
    oi[k] = make_uint4(0u, 0u, 0u, 0u);
  }
}

// This thread's two of a 64-row tile's 512 boxes (thread i: boxes 2i, 2i + 1 - row (2i) / 8,
// column blocks (2i) % 8 and the next), each a [1 row x 64 dims] TMA copy into the forward's
// key-buffer layout at `tile` (column block b at b * 8 KB, row r at r * 128; the TMA swizzles
// the line by its shared address), counted on `bar`. The issue spread over the CTA, as a
// producer warpgroup would spread it.
__device__ __forceinline__ void issue_tile_boxes(const CUtensorMap* map, const std::int32_t* tile_ids,
                                                 std::uint32_t tile, std::uint32_t bar) {
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int box = 2 * static_cast<int>(threadIdx.x) + k, row = box >> 3, blk = box & 7;
    tma_load_2d(tile + blk * (kTileRows * 128) + row * 128, map, blk * 64, tile_ids[row], bar);
  }
}

// Thread (r, c) = (tid / 64, tid % 64) copies 16-byte chunk c of rows r, r + 4, .., r + 60 of a
// tile: a warp instruction is half a row's 1 KB (32 chunks, contiguous), as the forward's
// 128-byte lines. It sums only the chunks it copied itself, after its own copies of the tile
// landed (cp.async.wait_group), so no thread waits for another: the ring of kStages tiles is
// per thread.
__global__ void __launch_bounds__(kThreads, 1)
    gather_ceiling_kernel(const bf16* rows, const std::int32_t* ids, int items, int keys_per_item,
                          const bf16* q, bf16* out, bool streams, unsigned* checksum) {
  extern __shared__ uint4 stage_smem[];
  const int tid = threadIdx.x, r0 = tid >> 6, c = tid & 63;
  const std::uint32_t base = smem_addr(stage_smem);
  const int tiles_per_item = keys_per_item / kTileRows;
  unsigned sum = 0;
  auto add = [&sum](uint4 v) { sum += v.x + v.y + v.z + v.w; };
  auto issue = [&](long tile, int stage) {  // tile: the CTA's running tile index over its items
    const long item = blockIdx.x + (tile / tiles_per_item) * gridDim.x;
    const int t = static_cast<int>(tile % tiles_per_item);
    const std::int32_t* tile_ids = ids + item * keys_per_item + t * kTileRows;
#pragma unroll
    for (int k = 0; k < kChunksPerThread; ++k) {
      const int row = r0 + 4 * k;
      const char* src = reinterpret_cast<const char*>(rows) + static_cast<long>(tile_ids[row]) * kRowBytes + 16 * c;
      cp_async_16(base + stage * kTileBytes + row * kRowBytes + 16 * c, src);
    }
  };
  auto consume = [&](int stage) {
#pragma unroll
    for (int k = 0; k < kChunksPerThread; ++k)
      add(stage_smem[(stage * kTileBytes + (r0 + 4 * k) * kRowBytes) / 16 + c]);
  };
  const long my_items = blockIdx.x < items ? (items - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  const long tiles = my_items * tiles_per_item;
  // Prologue: kStages - 1 tiles in flight, one commit group each (empty groups past the end).
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles) issue(s, s);
    cp_async_commit();
  }
  for (long tile = 0; tile < tiles; ++tile) {
    const long next = tile + kStages - 1;
    // The stage refilled here was summed in the previous pass: keep those shared-memory loads
    // before the copies (cp_async_16 carries no memory clobber).
    asm volatile("" ::: "memory");
    if (next < tiles) issue(next, static_cast<int>(next % kStages));
    cp_async_commit();
    cp_async_wait<kStages - 1>();  // this thread's copies of `tile` have landed
    consume(static_cast<int>(tile % kStages));
    if (streams && tile % tiles_per_item == 0)
      stream_item(q, out, blockIdx.x + (tile / tiles_per_item) * gridDim.x, add);
  }
  cp_async_wait<0>();
  atomicAdd(checksum, sum);
}

// GatherCopy::tma_boxes: the ring of kStages tiles is the CTA's, each on a `full` mbarrier
// (one arrival with the tile's 64 KB of transactions). Per tile, after every thread has summed
// the stage it refills (__syncthreads), every thread issues its boxes (issue_tile_boxes). The
// stage's next phase is announced (expect_tx) by thread 0 before that barrier, so no copy
// completes against an unannounced phase.
__global__ void __launch_bounds__(kThreads, 1)
    gather_ceiling_tma_kernel(const __grid_constant__ CUtensorMap rows_map, const std::int32_t* ids, int items,
                              int keys_per_item, const bf16* q, bf16* out, bool streams, unsigned* checksum) {
  extern __shared__ unsigned char tma_smem_raw[];
  unsigned char* smem = tma_smem_raw + align_1024_pad(tma_smem_raw);  // the 128-byte swizzle's atoms
  const std::uint32_t base = smem_addr(smem);
  const std::uint32_t full_bar = base + kStages * kTileBytes;  // kStages mbarriers
  const uint4* stage_words = reinterpret_cast<const uint4*>(smem);
  const int tid = threadIdx.x;
  const int tiles_per_item = keys_per_item / kTileRows;
  unsigned sum = 0;
  auto add = [&sum](uint4 v) { sum += v.x + v.y + v.z + v.w; };
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) mbar_init(full_bar + 8u * s, 1);
    mbar_init_fence();
  }
  __syncthreads();
  auto issue = [&](long tile, int stage) {
    const long item = blockIdx.x + (tile / tiles_per_item) * gridDim.x;
    const int t = static_cast<int>(tile % tiles_per_item);
    issue_tile_boxes(&rows_map, ids + item * keys_per_item + t * kTileRows, base + stage * kTileBytes,
                     full_bar + 8u * stage);
  };
  const long my_items = blockIdx.x < items ? (items - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  const long tiles = my_items * tiles_per_item;
  if (tid == 0)
    for (int s = 0; s < kStages && s < tiles; ++s) mbar_arrive_expect_tx(full_bar + 8u * s, kTileBytes);
  __syncthreads();
  for (int s = 0; s < kStages && s < tiles; ++s) issue(s, s);
  for (long tile = 0; tile < tiles; ++tile) {
    const int stage = static_cast<int>(tile % kStages);
    mbar_wait(full_bar + 8u * stage, static_cast<std::uint32_t>((tile / kStages) & 1));
    const long next = tile + kStages;
    if (tid == 0 && next < tiles) mbar_arrive_expect_tx(full_bar + 8u * stage, kTileBytes);
#pragma unroll
    for (int k = 0; k < kChunksPerThread; ++k) add(stage_words[stage * (kTileBytes / 16) + k * kThreads + tid]);
    if (streams && tile % tiles_per_item == 0)
      stream_item(q, out, blockIdx.x + (tile / tiles_per_item) * gridDim.x, add);
    __syncthreads();  // the stage is summed by every thread: it may be refilled
    if (next < tiles) issue(next, stage);
  }
  atomicAdd(checksum, sum);
}

// launch_gather_tile_probe: one CTA; the tile, then a barrier, then the raw bytes out.
__global__ void __launch_bounds__(kThreads, 1)
    gather_tile_probe_kernel(const bf16* rows, const __grid_constant__ CUtensorMap rows_map, const std::int32_t* ids,
                             bool tma, std::uint32_t* tile_out) {
  extern __shared__ unsigned char probe_smem_raw[];
  unsigned char* smem = probe_smem_raw + align_1024_pad(probe_smem_raw);
  const std::uint32_t base = smem_addr(smem), bar = base + kTileBytes;
  const int tid = threadIdx.x;
  if (tid == 0) {
    mbar_init(bar, 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (tma) {
    if (tid == 0) mbar_arrive_expect_tx(bar, kTileBytes);
    __syncthreads();
    issue_tile_boxes(&rows_map, ids, base, bar);
    mbar_wait(bar, 0);
  } else {
    // Every (row, block, chunk) once, 16 bytes, at its swizzled place (the forward's layout).
    for (int e = tid; e < kTileRows * 8 * 8; e += kThreads) {
      const int row = e >> 6, blk = (e >> 3) & 7, c = e & 7;
      const char* src = reinterpret_cast<const char*>(rows) + static_cast<long>(ids[row]) * kRowBytes +
                        blk * 128 + c * 16;
      cp_async_16(base + blk * (kTileRows * 128) + row * 128 + ((c ^ (row & 7)) << 4), src);
    }
    cp_async_commit();
    cp_async_wait<0>();
  }
  __syncthreads();
  const std::uint32_t* words = reinterpret_cast<const std::uint32_t*>(smem);
  for (int k = tid; k < kTileBytes / 4; k += kThreads) tile_out[k] = words[k];
}

}  // namespace

void launch_gather_tile_probe(const bf16* rows, long table_rows, const std::int32_t* ids, GatherCopy copy,
                              std::uint32_t* tile_out, cudaStream_t stream) {
  require(table_rows > 0, ErrorKind::InvalidArgument, "gather tile probe: the table needs rows");
  const std::size_t smem = 1024 + static_cast<std::size_t>(kTileBytes) + 8;
  allow_dynamic_smem(gather_tile_probe_kernel, smem, "the gather tile probe");
  const CUtensorMap map = bf16_rows_tensor_map(rows, table_rows, 512, 1, 64);
  gather_tile_probe_kernel<<<1, kThreads, smem, stream>>>(rows, map, ids, copy == GatherCopy::tma_boxes, tile_out);
  CSATTN_CUDA_LAUNCH_CHECK();
}

void launch_gather_ceiling(const bf16* rows, const std::int32_t* ids, int items, int keys_per_item,
                           const bf16* q, bf16* out, bool streams, unsigned* checksum, cudaStream_t stream,
                           GatherCopy copy, long table_rows) {
  require(keys_per_item > 0 && keys_per_item % kTileRows == 0, ErrorKind::InvalidArgument,
          "gather ceiling: keys_per_item must be a positive multiple of 64, got " + std::to_string(keys_per_item));
  require(!streams || (q != nullptr && out != nullptr), ErrorKind::InvalidArgument,
          "gather ceiling: the streams need q and out");
  require(copy == GatherCopy::cp_async || table_rows > 0, ErrorKind::InvalidArgument,
          "gather ceiling: TMA boxes need the table's row count");
  if (items <= 0) return;
  const int grid = std::min(items, multiprocessor_count());
  if (copy == GatherCopy::tma_boxes) {
    // + 1 KB: the dynamic base aligned up to 1024 bytes; + the stages' mbarriers.
    const std::size_t smem = 1024 + static_cast<std::size_t>(kStages) * kTileBytes + 8 * kStages;
    allow_dynamic_smem(gather_ceiling_tma_kernel, smem, "the gather ceiling kernel (TMA boxes)");
    const CUtensorMap map = bf16_rows_tensor_map(rows, table_rows, 512, 1, 64);
    gather_ceiling_tma_kernel<<<grid, kThreads, smem, stream>>>(map, ids, items, keys_per_item, q, out, streams,
                                                                 checksum);
    CSATTN_CUDA_LAUNCH_CHECK();
    return;
  }
  const std::size_t smem = static_cast<std::size_t>(kStages) * kTileBytes;
  allow_dynamic_smem(gather_ceiling_kernel, smem, "the gather ceiling kernel");
  gather_ceiling_kernel<<<grid, kThreads, smem, stream>>>(rows, ids, items, keys_per_item, q, out, streams,
                                                           checksum);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
