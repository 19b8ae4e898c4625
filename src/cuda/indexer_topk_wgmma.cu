// The lightning indexer on warpgroup MMAs (Hopper, sm_90a): the tiled kernel's contract
// (indexer_topk_tiled.cu: 4 consecutive query rows per CTA, scores in the same per-CTA
// global slot, the same radix select), with the scoring moved from mma.sync + ldmatrix to
// wgmma, which reads both operands from shared memory itself.
//
// Why: the tiled kernel is bound by its shared-memory pipe (ldmatrix of every key tile by
// all 8 warps, 61% busy in Nsight Compute) at ~250 TFLOPS. Here one wgmma
// m64n256k16 computes S^T = K Q^T for 64 keys (M) x the CTA's 4 rows x 64 heads (N = 256)
// over 16 dims, reading 2 KB of keys and 8 KB of queries per 128 tensor-core cycles: 80 B
// per cycle against the pipe's 128, so the MMAs, not the loads, set the pace.
//
// Two warpgroups, no producer: warpgroup c scores tiles c, c + 2, c + 4, ... of the run with
// its own 3-stage ring of TMA-loaded key tiles (one mbarrier a stage) and its own named
// barrier, so the two drift apart and one's epilogue (ReLU, head weights, head sum, score
// store) overlaps the other's MMAs. The queries of the CTA's rows stay in shared memory for
// the whole run ([256 x DI], K-major).
//
// Bitwise agreement with the tiled kernel: the accumulator of m64nNk16 holds, per thread,
// rows (keys) 16w + g and + 8 and columns 8i + 2q + {0, 1}, the layout of the mma.sync C
// fragment the tiled kernel sums; the epilogue adds in its tree's order (per 16-head group
// head_pair_term over (h, h + 8) for two adjacent heads, the 4-lane butterfly - here as a
// reduce-scatter over the quad's four rows: 3 shuffles a group instead of 8, measured 2026-12-05
// to cut the head sums 1211 -> 830 cycles a tile - then the groups as ((G0 + G1) + G2) + G3),
// so equal per-head dot products give equal scores.
#include <algorithm>

#include "cuda/check.hpp"
#include "cuda/indexer_block.cuh"
#include "cuda/indexer_score.cuh"
#include "cuda/indexer_topk_plan.hpp"
#include "cuda/indexer_topk_tiled.hpp"
#include "cuda/indexer_wgmma_tile.cuh"
#include "cuda/mma_util.cuh"
#include "cuda/phase_stamp.cuh"
#include "cuda/tma.hpp"
#include "cuda/wgmma.cuh"
#include "cuda/wgmma_sync.cuh"

namespace csattn::cuda {

namespace {

constexpr int kThreads = 256;  // two warpgroups
static_assert(kThreads == idxwg::kScoreThreads, "score_run's threads are the whole CTA");
using idxwg::kKeys;
using idxwg::kRows;
using idxwg::kStages;
using idxwg::Layout;

// kStamps (measurement only): clock() at the phase boundaries into `stamps`, laid out as
// IndexerStamps (indexer_topk_tiled.hpp) says. The key tiles come by TMA through `key_map`
// ([comp_capacity x DI] in boxes of 64 keys x 64 dims, the 128-byte swizzle), one thread of
// the warpgroup issuing a tile's boxes on its stage's mbarrier, which counts their bytes:
// 4-6% faster at 32K-128K tokens on an H100 than 8 cp.async a thread and tile (2026-12-06).
// kScores: the select also writes the selected ids' scores into scores_out (SelectedScores;
// the layer's forward, for the sparse loss), an instance of its own (indexer_select.cuh).
template <int DI, bool kStamps, bool kScores>
__global__ void __launch_bounds__(kThreads, 1)
    indexer_topk_wgmma_kernel(LayerDims d, DeviceMetadata meta, const bf16* qi, const float* w_eff,
                              const bf16* keys, std::int32_t* topk, unsigned* counter,
                              float* slots, long row_stride, unsigned* stamps,
                              const __grid_constant__ CUtensorMap key_map, float* scores_out,
                              int score_stride) {
  using L = Layout<DI>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + align_1024_pad(smem_raw);  // wgmma's swizzle atoms
  const std::uint32_t base = smem_addr(smem);
  unsigned* hist = reinterpret_cast<unsigned*>(smem + L::kHistOff);  // [kRows, 2048]
  float* w_s = reinterpret_cast<float*>(smem + L::kWOff);             // [kRows, 64]
  __shared__ idxsel::SelectShared sel[kRows];
  __shared__ idxblock::Shared sh;
  // Stage s of warpgroup c's ring is full once full[c][s]'s phase completes.
  __shared__ alignas(8) std::uint64_t full[2][kStages];

  const int tid = threadIdx.x;
  float* slot = slots + static_cast<long>(blockIdx.x) * kRows * row_stride;
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;

  using Stamps = IndexerStamps;
  // Row `row`, phase `phase` of the stamped block's first run.
  bool stamping = false;
  auto stamp = [&](int row, int phase) {
    if constexpr (kStamps) {
      if (stamping && row <= Stamps::tiles)
        write_phase_stamp<Stamps::ctas, 2, Stamps::tiles + 1, Stamps::phases>(stamps, row, phase);
    }
  };
  auto stamp_tile = [&](int u, int phase) {
    if (u < Stamps::tiles) stamp(u, phase);
  };

  if (tid == 0) {
    for (int c = 0; c < 2; ++c)
      for (int st = 0; st < kStages; ++st) mbar_init(smem_addr(&full[c][st]), 1);
    mbar_init_fence();
  }
  __syncthreads();
  // This warpgroup's key tiles loaded so far, over all runs: load n goes to stage n % kStages
  // and completes phase n / kStages of its barrier.
  int loads_before = 0;

  int t0 = 0;
  unsigned todo = 0;
  for (int local = 0; idxblock::next_block<kThreads>(d, meta, counter, topk, hist, sh, t0, todo); ++local) {
    const unsigned selecting = todo;
    if constexpr (kStamps) stamping = local == Stamps::block;
    stamp(Stamps::tiles, 0);
    // The columns of rows outside the run are zero and never written.
    while (todo != 0u) {
      int run_seg = 0, n_run = 0;
      const unsigned run = idxblock::take_run(todo, sh, run_seg, n_run);
      // Once a run: a global load a tile would sit on the warpgroup's critical path (measured).
      const int seg_row0 = meta.comp_start[run_seg];

      idxwg::score_run<DI, true>(d, qi, w_eff, &key_map, base, w_s, hist, full, sh, run, t0, n_run, seg_row0, slot,
                                 row_stride, loads_before, acc, [] { __syncthreads(); },
                                 [&](int phase) { stamp(Stamps::tiles, phase); }, stamp_tile);
      stamp(Stamps::tiles, 2);
      stamping = false;  // the block's first run only
    }
    // The four rows side by side, a quarter of the CTA each (measured 2026-12-05: the
    // block's selection 122K -> 104K cycles at 32K tokens against one row after another).
    // Rows that fit a quarter of the Q and key buffers, dead until the next block, are selected
    // from a copy in shared memory (measured 2026-12-06 on an H100: the block's selection
    // 104.8K -> 72.1K cycles at 32K tokens, the indexer 1-6% faster at 32K-128K tokens).
    constexpr int kStageFloats = L::kHistOff / 4 / kRows / 4 * 4;
    idxblock::select_block<kThreads, true, kScores>(d, selecting, sh, t0, slot, row_stride, hist, sel, topk,
                                     reinterpret_cast<float*>(smem), kStageFloats, scores_out,
                                     score_stride);
    if constexpr (kStamps) stamping = local == Stamps::block;
    stamp(Stamps::tiles, 3);
  }
}

template <int DI>
void launch_wgmma(const LayerDims& d, const DeviceMetadata& meta, const bf16* qi, const float* w_eff,
                  const bf16* keys, std::int32_t* topk, void* scratch, cudaStream_t stream,
                  unsigned* stamps, const SelectedScores& scores) {
  const CUtensorMap map = idxwg::key_tile_map<DI>(d, keys);
  // One CTA per SM (its shared memory allows one); + 1 KB: the base's alignment to 1024.
  require(stamps == nullptr || scores.base == nullptr, ErrorKind::InvalidArgument,
          "the wgmma indexer's phase stamps (benchmarks) come without selected scores");
  auto kernel = stamps != nullptr        ? indexer_topk_wgmma_kernel<DI, true, false>
                : scores.base != nullptr ? indexer_topk_wgmma_kernel<DI, false, true>
                                         : indexer_topk_wgmma_kernel<DI, false, false>;
  idxblock::launch_block_kernel(kernel, kThreads, 1, 1024 + Layout<DI>::kBytes, "the wgmma indexer", d,
                                meta, qi, w_eff, keys, topk, scratch, stream, stamps, map, scores.base,
                                scores.stride);
}

}  // namespace

void launch_indexer_topk_wgmma(const LayerDims& d, const DeviceMetadata& meta, const bf16* qi,
                               const float* w_eff, const bf16* keys, std::int32_t* topk,
                               void* scratch, cudaStream_t stream, unsigned* phase_stamps,
                               const SelectedScores& scores) {
  require(indexer_tiled_supported(d), ErrorKind::Unsupported,
          "the wgmma indexer needs index_n_heads <= 64 and index_head_dim 64 or 128");
  require(scratch != nullptr, ErrorKind::InvalidArgument, "the wgmma indexer needs its scratch");
  if (d.index_dim == 128) launch_wgmma<128>(d, meta, qi, w_eff, keys, topk, scratch, stream, phase_stamps, scores);
  else launch_wgmma<64>(d, meta, qi, w_eff, keys, topk, scratch, stream, phase_stamps, scores);
}

}  // namespace csattn::cuda
