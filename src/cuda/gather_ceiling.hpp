// Measurement only (the `gathers` benchmark section): how fast random 1 KB key rows can be
// brought from global into shared memory by 16-byte cp.async, in the wgmma forward's pattern -
// the forward's memory roofline. At 32K+ keys the forward runs at the memory system's
// throughput (Nsight Compute, perf.md twenty-sixth session); this kernel moves the same bytes
// and nothing else, so the forward's TFLOPS can be set against 128 FLOPs per gathered byte
// (2 x 64 heads x 1,024 a 1 KB row) times this rate.
//
// Work item i gathers rows ids[K i .. K i + K) (K a multiple of 64) of `rows` ([any x 512]
// bf16) in 64-row tiles, three tiles in flight a thread; persistent, one CTA a multiprocessor
// (the forward's occupancy). With `streams`, an item also reads its 64 KB of `q` (row-major,
// [items x 64 x 512] bf16) and writes 64 KB of `out` - the forward's Q and O. Every 32-bit
// word gathered or read is added (mod 2^32) into *checksum, which the caller compares with the
// host's sum of the same words: the copies cannot be dropped and their data is checked.
//
// GatherCopy picks how a row moves: `cp_async` (16-byte cp.async, as the forward now), or
// `tma_boxes` - eight TMA tensor copies of a [1 row x 64 dims] 128-byte box a row, each into
// its 128-byte line of the forward's swizzled layout (column block b of the tile, row r at
// r * 128), three 64 KB tiles in flight on mbarriers. The second is the issue-rate measurement
// a TMA-multicast cluster forward needs first (design.md, "What comes next"): no TMA gather
// exists on sm_90, so a row is eight such boxes. `rows` must then be 16-byte aligned. The word
// sum is blind to where a chunk lands inside the tile, so the boxes' swizzled placement (the
// TMA swizzles by the shared address: row r's chunk c at c ^ (r % 8)) is checked by
// launch_gather_tile_probe's test instead. The launch encodes the map each call (microseconds,
// inside the timed runs of ~1 ms).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/params.hpp"

namespace csattn::cuda {

enum class GatherCopy { cp_async, tma_boxes };

// The copy path's name in the bench's tables and JSON and in the tests' messages.
inline const char* gather_copy_name(GatherCopy c) { return c == GatherCopy::cp_async ? "cp.async" : "tma boxes"; }

// `table_rows`: the rows of `rows` (the TMA map's bound; ids must lie below it).
void launch_gather_ceiling(const bf16* rows, const std::int32_t* ids, int items, int keys_per_item,
                           const bf16* q, bf16* out, bool streams, unsigned* checksum, cudaStream_t stream,
                           GatherCopy copy = GatherCopy::cp_async, long table_rows = 0);

// Test only: one 64-row tile of `rows` (ids[0..63]) moved into shared memory by `copy` in the
// forward's key-buffer layout - column block b of 64 dims at b * 8 KB, row r at r * 128, its
// 16-byte chunk c at (c ^ (r % 8)) * 16 - and that 64 KB written raw to `tile_out`, so a test
// can compare it byte for byte with the layout computed on the host (cp_async writes the
// swizzle itself; tma_boxes relies on the TMA swizzling a 1-row box by its shared address).
void launch_gather_tile_probe(const bf16* rows, long table_rows, const std::int32_t* ids, GatherCopy copy,
                              std::uint32_t* tile_out, cudaStream_t stream);

}  // namespace csattn::cuda
