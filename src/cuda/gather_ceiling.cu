// launch_gather_ceiling (gather_ceiling.hpp).
#include "cuda/gather_ceiling.hpp"

#include <algorithm>
#include <string>

#include "cuda/check.hpp"
#include "cuda/mma_util.cuh"

namespace csattn::cuda {

namespace {

constexpr int kThreads = 256, kTileRows = 64, kRowBytes = 1024, kStages = 3;
constexpr int kTileBytes = kTileRows * kRowBytes;
constexpr int kChunksPerThread = kTileBytes / 16 / kThreads;  // 16

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
    if (streams && tile % tiles_per_item == 0) {
      // The item's Q (read once) and O (written once), 64 KB each, 16-byte accesses.
      const long item = blockIdx.x + (tile / tiles_per_item) * gridDim.x;
      const uint4* qi = reinterpret_cast<const uint4*>(q + item * kTileRows * 512);
      uint4* oi = reinterpret_cast<uint4*>(out + item * kTileRows * 512);
#pragma unroll 4
      for (int k = tid; k < kTileBytes / 16; k += kThreads) {
        add(qi[k]);
        oi[k] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  }
  cp_async_wait<0>();
  atomicAdd(checksum, sum);
}

}  // namespace

void launch_gather_ceiling(const bf16* rows, const std::int32_t* ids, int items, int keys_per_item,
                           const bf16* q, bf16* out, bool streams, unsigned* checksum, cudaStream_t stream) {
  require(keys_per_item > 0 && keys_per_item % kTileRows == 0, ErrorKind::InvalidArgument,
          "gather ceiling: keys_per_item must be a positive multiple of 64, got " + std::to_string(keys_per_item));
  require(!streams || (q != nullptr && out != nullptr), ErrorKind::InvalidArgument,
          "gather ceiling: the streams need q and out");
  if (items <= 0) return;
  const std::size_t smem = static_cast<std::size_t>(kStages) * kTileBytes;
  allow_dynamic_smem(gather_ceiling_kernel, smem, "the gather ceiling kernel");
  const int grid = std::min(items, multiprocessor_count());
  gather_ceiling_kernel<<<grid, kThreads, smem, stream>>>(rows, ids, items, keys_per_item, q, out, streams,
                                                           checksum);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
