// The launchers of the two multi-row indexers, called by launch_indexer_topk: the tiled
// mma.sync kernel (indexer_topk_tiled.cu) and its wgmma successor (indexer_topk_wgmma.cu),
// which share the shapes they take, the scratch and the result bit for bit.
#pragma once
#include <cuda_runtime.h>

#include "cuda/indexer_topk_plan.hpp"
#include "cuda/params.hpp"

namespace csattn::cuda {

// scratch: indexer_topk_scratch_bytes(d) bytes (indexer_topk_plan.hpp), any contents.
void launch_indexer_topk_tiled(const LayerDims& d, const DeviceMetadata& meta, const bf16* qi,
                               const float* w_eff, const bf16* keys, std::int32_t* topk,
                               void* scratch, cudaStream_t stream);
void launch_indexer_topk_wgmma(const LayerDims& d, const DeviceMetadata& meta, const bf16* qi,
                               const float* w_eff, const bf16* keys, std::int32_t* topk,
                               void* scratch, cudaStream_t stream,
                               unsigned* phase_stamps = nullptr, const SelectedScores& scores = {});
// The wgmma indexer with a third warpgroup selecting block b while the other two score block
// b + 1 (indexer_topk_wgmma_overlap.cu; the default where the tiled shapes hold): the same
// ids and scores. totals: IndexerOverlapTotals (measurement only; without selected scores).
void launch_indexer_topk_wgmma_overlap(const LayerDims& d, const DeviceMetadata& meta, const bf16* qi,
                                       const float* w_eff, const bf16* keys, std::int32_t* topk,
                                       void* scratch, cudaStream_t stream, const SelectedScores& scores = {},
                                       unsigned long long* totals = nullptr);

// Measurement only (benchmarks): the wgmma indexer's phase_stamps, the multiprocessor's
// 32-bit clock() with its lowest bit set (0 means "not reached"; subtract modulo 2^32),
// written by the first thread of each warpgroup of CTAs 0 .. ctas - 1 for the CTA's block
// number `block` (counted from 0 per CTA; blocks are taken longest rows first) and that
// block's first run, at stamps[((cta * 2 + warpgroup) * (tiles + 1) + row) * phases + p].
// Row u < tiles is the warpgroup's u-th key tile (tile 2u + warpgroup of the run): 0 loop
// top, 1 the tile's keys ready (the stage's mbarrier - TMA - and the warpgroup's barrier), 2 the load two
// tiles ahead issued, 3 the MMAs done, 4 the head sums done, 5 the scores stored and
// counted. Row `tiles`: 0 block start, 1 the run's queries and weights ready, 2 the run's
// scoring done, 3 the block's selection done. Stamps not reached stay as the caller left
// them (zero them first).
struct IndexerStamps {
  static constexpr int ctas = 132, block = 2, tiles = 64, phases = 6;
  static constexpr long count() { return static_cast<long>(ctas) * 2 * (tiles + 1) * phases; }
};

// Measurement only (benchmarks): the overlapped wgmma indexer's clock64() totals over the
// whole launch, per CTA c < ctas at totals[c * slots + slot] (the caller zeroes them; a card
// of more SMs takes the two-warpgroup kernel, which writes none). The scoring side (the CTA's
// thread 0), summed over the blocks it scored: `blocks`; `free_wait` - from the top of an
// attempt to its copy of the block state being free (the ticket's atomic and the wait for the
// selection of the block two attempts back); `setup` - the block's rows and which of them to
// score; `scoring` - its runs scored and handed over. The selecting warp of row r (lane 0),
// at row_slot(r, .): `scored_wait` - waiting for a scored block (and the stop), then over the
// `selected` blocks whose row r had more visible entries than top-k: `count` - the first
// digit's histogram, `digit1` - its bin found and the second digit's histogram, `digit2` -
// the same for the third, `threshold` - its bin found, `write` - the ids written.
struct IndexerOverlapTotals {
  static constexpr int ctas = kIdxTiledMaxCtas / 2;  // the most the overlapped kernel runs
  enum Slot { blocks, free_wait, setup, scoring, first_row_slot };
  enum RowSlot { scored_wait, count, digit1, digit2, threshold, write, selected, row_slots };
  static constexpr int rows = 4;
  static constexpr int slots = first_row_slot + rows * row_slots;
  static constexpr int row_slot(int r, int s) { return first_row_slot + r * row_slots + s; }
  static constexpr long size() { return static_cast<long>(ctas) * slots; }
};

}  // namespace csattn::cuda
