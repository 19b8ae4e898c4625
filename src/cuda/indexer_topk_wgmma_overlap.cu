// The wgmma indexer with its selection overlapped with the scoring: the default indexer
// (IndexerKernel::wgmma_overlap) since the sixteenth session.
//
// Why: the two-warpgroup kernel (indexer_topk_wgmma.cu) scores a block of 4 rows, then all
// its threads select the rows' top-k while the tensor cores idle. Its phase stamps (H100,
// perf.md fifteenth session): per block at 32K tokens, scoring 245K cycles, selection 74K -
// 23% of the block with nothing on the tensor pipe. Here a third warpgroup selects block b
// (a row a warp) while the two scoring warpgroups score block b + 1, so a block costs
// max(scoring, selection) instead of their sum. The scoring warpgroups no longer count the
// first radix digit; the selecting warp counts it in a pass of its own over the row
// (digit_histogram's kAll). Measured (H100, perf.md sixteenth session): 341-357 -> 392-405
// TFLOPS at 32K-128K tokens (predicted 440-480); its totals (kTotals) then showed the
// selection setting the pace (a block at 32K tokens: 120K cycles of scoring, 156K of
// selection), and the one-warp id writes in one coalesced pass (idxsel::write_ids_warp_scan)
// took the selection to 138K and the kernel to 430-452 TFLOPS; keeping the first digit's
// bin in shared memory for the third digit (below) took the third digit's pass 30K -> 12K and
// the kernel to 460-496 TFLOPS (seventeenth session). What is left: the count and the second
// digit's pass over the row in L2 (~33K and ~44K cycles a block) and the id writes (~41K).
//
// The scoring is the two-warpgroup kernel's (idxwg::score_run, indexer_wgmma_tile.cuh, without
// the histogram), so the scores and the ids are bit for bit its own. The hand-over:
// each CTA owns two score slots of the scratch (CTA c: slots 2c and 2c + 1; at most 132 CTAs
// of the scratch's 264 slots) and two copies of the block state; block attempt a uses copy
// p = a % 2. Named barrier 4 + p: "attempt a scored" (the scoring threads arrive, the
// selecting warps wait); 6 + p: "copy p is free" (the selecting warps arrive after attempt a,
// the scoring threads wait before attempt a + 2). A failed ticket is the stop signal.
#include <algorithm>
#include <type_traits>

#include "cuda/check.hpp"
#include "cuda/indexer_block.cuh"
#include "cuda/indexer_topk_plan.hpp"
#include "cuda/indexer_topk_tiled.hpp"
#include "cuda/indexer_wgmma_tile.cuh"
#include "cuda/mma_util.cuh"
#include "cuda/tma.hpp"
#include "cuda/wgmma.cuh"
#include "cuda/wgmma_sync.cuh"

namespace csattn::cuda {

namespace {

using idxwg::kKeys;
using idxwg::kRows;
using idxwg::kStages;
using idxwg::Layout;

constexpr int kScoreThreads = idxwg::kScoreThreads;  // warpgroups 0 and 1 (score_run's)
constexpr int kSelectThreads = 128;  // warpgroup 2: warp 8 + r selects row r of a block
constexpr int kThreads = kScoreThreads + kSelectThreads;
static_assert(kSelectThreads / 32 == kRows, "one selecting warp a row");
static_assert(IndexerOverlapTotals::rows == kRows, "the totals' rows are the selecting warps'");
// setmaxnreg moves registers inside the launch allocation (65536 / 384 -> 168 a thread):
// 256 x 208 + 128 x 88 = 384 x 168. The two-warpgroup kernel took 228 registers; here the
// scoring fits 208 without its histogram (ptxas: no spill), and the one-warp radix select
// with four loads in flight a lane spilled at 56 and 72, not at 88; its scan writes
// (idxsel::write_ids_warp_scan) spilled 4-8 bytes at 88 in some instance whatever their
// loads ahead (2-4), so 200 / 104 (the scoring at 200 without a spill; measured with them,
// sixteenth session).
constexpr int kScoreRegs = 200, kSelectRegs = 104;
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
static_assert(kScoreThreads * kScoreRegs + kSelectThreads * kSelectRegs <= kThreads * kLaunchRegs,
              "setmaxnreg budget exceeds the launch allocation");
// Named barriers: 1 + wg each scoring warpgroup's own, kBarScoring both scoring warpgroups,
// kBarScored0 + p and kBarFree0 + p the hand-over of copy p (all threads of the CTA count).
constexpr int kBarScoring = 3, kBarScored0 = 4, kBarFree0 = 6;
// A selecting warp's room for its first-digit bin's keys. The largest layout (D_I
// 128: 193 KB) + 1 KB of alignment + ~2.2 KB of static shared memory leave ~30.8 KB of the
// 227 KB a CTA may have: 4 rows x 1920 keys x 4 bytes.
constexpr int kKept = 1920;

// kTotals: clock64() intervals summed by phase; add_since(what) adds the time since the last
// call (or construction) to sums[what]. kOn false: nothing (the measured instances).
template <int N, bool kOn>
struct ClockSums {
  unsigned long long sums[N] = {};
  long long mark = 0;
  __device__ ClockSums() {
    if constexpr (kOn) mark = clock64();
  }
  __device__ void add_since(int what) {
    if constexpr (kOn) {
      const long long now = clock64();
      sums[what] += static_cast<unsigned long long>(now - mark);
      mark = now;
    }
  }
};
constexpr int kKeptBytes = kRows * kKept * 4;

// kTotals (measurement only): clock64() totals of where each side's time goes into `totals`
// (IndexerOverlapTotals, indexer_topk_tiled.hpp); an instance of its own, so the measured
// kernels carry none of it. Each selecting warp keeps its row's keys of the first digit's bin
// in shared memory (kKept of them at most, past the layout) while counting the second digit,
// and counts the third from there (idxsel::select_topk_radix's one-warp path); a row whose bin
// holds more takes another pass over its scores. Why: the totals (sixteenth session) put that
// pass at ~30K of the selection's 138K cycles a block at 32K tokens, the scoring at ~120K.
// Measured (seventeenth session, H100): the third digit 30K -> 12K cycles, the indexer
// 430/448/458 -> 460/486/496 TFLOPS at 32K/64K/128K tokens.
template <int DI, bool kScores, bool kTotals>
__global__ void __launch_bounds__(kThreads, 1)
    indexer_topk_wgmma_overlap_kernel(LayerDims d, DeviceMetadata meta, const bf16* qi, const float* w_eff,
                                      const bf16* keys, std::int32_t* topk, unsigned* counter,
                                      float* slots, long row_stride, unsigned long long* totals,
                                      const __grid_constant__ CUtensorMap key_map, float* scores_out,
                                      int score_stride) {
  using Totals = IndexerOverlapTotals;
  using L = Layout<DI>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + align_1024_pad(smem_raw);  // wgmma's swizzle atoms
  const std::uint32_t base = smem_addr(smem);
  unsigned* hist = reinterpret_cast<unsigned*>(smem + L::kHistOff);  // [kRows, kBins]: the selecting warps'
  float* w_s = reinterpret_cast<float*>(smem + L::kWOff);             // [kRows, 64]
  // [kRows, kKept] keys of the first digit's bin, past the layout.
  unsigned* kept = reinterpret_cast<unsigned*>(smem + L::kBytes);
  __shared__ idxsel::SelectShared sel[kRows];
  __shared__ idxblock::Shared sh[2];  // the block state of attempts a with a % 2 = p
  // Stage s of scoring warpgroup c's ring is full once full[c][s]'s phase completes.
  __shared__ alignas(8) std::uint64_t full[2][kStages];

  const int K = d.topk;
  const int tid = threadIdx.x, warp = tid >> 5;
  const int wg = warp >> 2;
  const int blocks = (d.rows + kRows - 1) / kRows;
  auto slot_of = [&](int p) { return slots + (static_cast<long>(blockIdx.x) * 2 + p) * kRows * row_stride; };

  if (tid == 0) {
    for (int c = 0; c < 2; ++c)
      for (int st = 0; st < kStages; ++st) mbar_init(smem_addr(&full[c][st]), 1);
    mbar_init_fence();
  }
  __syncthreads();  // the last CTA-wide barrier: the warpgroups part here

  if (wg == 2) {  // ---- selection: warp 8 + r takes row r of every scored block ----
    setmaxnreg_dec<kSelectRegs>();
    const int r = warp - 2 * 4;
    // kTotals: this warp's sums (Totals::RowSlot order), written by lane 0 at the end.
    ClockSums<Totals::row_slots, kTotals> phase_clock;
    auto add_since = [&](int what) { phase_clock.add_since(what); };
    for (int attempt = 0;; ++attempt) {
      const int p = attempt & 1;
      named_barrier_sync(kBarScored0 + p, kThreads);  // copy p and its slot hold attempt a
      add_since(Totals::scored_wait);
      const int ticket = sh[p].ticket;
      if (ticket >= blocks) break;  // the scoring warpgroups found no block: done
      const int t0 = idxblock::block_first_row(d, ticket), n = sh[p].n[r];
      if (n > K) {  // scored (n <= K: the scoring threads wrote the row's ids)
        const float* scores = slot_of(p) + r * row_stride;
        unsigned* h = hist + r * idxsel::kBins;
        std::int32_t* out = topk + static_cast<long>(t0 + r) * K;
        idxsel::digit_histogram<idxsel::WarpThreads, true>(scores, n, 0u, idxsel::kDigit1Bits + idxsel::kDigit2Bits,
                                                           idxsel::kDigit0Bits, h);
        add_since(Totals::count);
        auto phase_mark = [&](int phase) {
          if constexpr (kTotals) {
            // (phase 4, the ranks' count, is the multi-warp groups': one warp has none)
            constexpr int kSlot[6] = {0, Totals::digit1, Totals::digit2, Totals::threshold, -1, Totals::write};
            if (kSlot[phase] >= 0) add_since(kSlot[phase]);
          }
        };
        idxsel::select_topk_radix<idxsel::WarpThreads, kScores>(
            scores, n, K, h, sel[r], out, false,
            kScores ? scores_out + static_cast<long>(t0 + r) * K * score_stride : nullptr, kScores ? score_stride : 1,
            phase_mark, kept + r * kKept, kKept);
        if constexpr (kTotals) ++phase_clock.sums[Totals::selected];
      }
      __threadfence_block();
      named_barrier_arrive(kBarFree0 + p, kThreads);  // done with copy p and its slot
    }
    if constexpr (kTotals) {
      if ((tid & 31) == 0 && blockIdx.x < Totals::ctas)
        for (int k = 0; k < Totals::row_slots; ++k)
          totals[blockIdx.x * Totals::slots + Totals::row_slot(r, k)] = phase_clock.sums[k];
    }
    return;
  }

  // ---- scoring: warpgroups 0 and 1, as in the two-warpgroup kernel ----
  setmaxnreg_inc<kScoreRegs>();
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  // This warpgroup's key tiles loaded so far, over all runs: load n goes to stage n % kStages
  // and completes phase n / kStages of its barrier.
  int loads_before = 0;
  // kTotals: thread 0's sums (Totals::Slot order up to first_row_slot), written at the end.
  ClockSums<Totals::first_row_slot, kTotals> phase_clock;
  auto add_since = [&](int what) { phase_clock.add_since(what); };

  for (int attempt = 0;; ++attempt) {
    const int p = attempt & 1;
    idxblock::Shared& bs = sh[p];
    // The ticket's atomic is in flight while attempt a - 2's selection finishes with copy p
    // and its slot (the free barrier; that arrival consumed), stored once it has.
    const int taken = tid == 0 ? static_cast<int>(atomicAdd(counter, 1u)) : 0;
    if (attempt >= 2) named_barrier_sync(kBarFree0 + p, kThreads);
    if (tid == 0) bs.ticket = taken;
    named_barrier_sync(kBarScoring, kScoreThreads);
    const int ticket = bs.ticket;
    if (ticket >= blocks) {
      __threadfence_block();
      named_barrier_arrive(kBarScored0 + p, kThreads);  // the selecting warps' stop
      // Attempt a - 1's arrival on its copy's free barrier is the one no later attempt waits
      // for: consumed here, so no barrier is left half-arrived at exit.
      if (attempt >= 1) named_barrier_sync(kBarFree0 + (p ^ 1), kThreads);
      if constexpr (kTotals) {
        if (tid == 0 && blockIdx.x < Totals::ctas)
          for (int k = 0; k < Totals::first_row_slot; ++k) totals[blockIdx.x * Totals::slots + k] = phase_clock.sums[k];
      }
      return;
    }
    add_since(Totals::free_wait);
    // The block (idxblock::next_block without the histograms: the selecting warp counts them).
    const int t0 = idxblock::block_first_row(d, ticket);
    idxblock::block_rows(d, meta, tid, t0, bs);
    named_barrier_sync(kBarScoring, kScoreThreads);
    unsigned todo = idxblock::block_todo<kScoreThreads>(d, tid, t0, bs, topk);
    float* slot = slot_of(p);
    add_since(Totals::setup);

    while (todo != 0u) {
      int run_seg = 0, n_run = 0;
      const unsigned run = idxblock::take_run(todo, bs, run_seg, n_run);
      const int seg_row0 = meta.comp_start[run_seg];  // once a run (measured: not a tile)
      idxwg::score_run<DI, false>(d, qi, w_eff, &key_map, base, w_s, nullptr, full, bs, run, t0, n_run, seg_row0,
                                  slot, row_stride, loads_before, acc,
                                  [] { named_barrier_sync(kBarScoring, kScoreThreads); }, [](int) {},
                                  [](int, int) {});
    }
    // The block's scores (global) and state (shared) to the selecting warps.
    __threadfence_block();
    named_barrier_arrive(kBarScored0 + p, kThreads);
    add_since(Totals::scoring);
    if constexpr (kTotals) ++phase_clock.sums[Totals::blocks];
  }
}

template <int DI>
void launch_overlap(const LayerDims& d, const DeviceMetadata& meta, const bf16* qi, const float* w_eff,
                    const bf16* keys, std::int32_t* topk, void* scratch, cudaStream_t stream,
                    const SelectedScores& scores, unsigned long long* totals) {
  const CUtensorMap map = idxwg::key_tile_map<DI>(d, keys);
  require(totals == nullptr || scores.base == nullptr, ErrorKind::InvalidArgument,
          "the overlapped wgmma indexer's totals (benchmarks) come without selected scores");
  auto kernel = totals != nullptr        ? indexer_topk_wgmma_overlap_kernel<DI, false, true>
                : scores.base != nullptr ? indexer_topk_wgmma_overlap_kernel<DI, true, false>
                                         : indexer_topk_wgmma_overlap_kernel<DI, false, false>;
  // One CTA per SM; + 1 KB: the base's alignment to 1024.
  const std::size_t smem = 1024 + Layout<DI>::kBytes + kKeptBytes;
  idxblock::launch_block_kernel(kernel, kThreads, 1, smem, "the overlapped wgmma indexer",
                                d, meta, qi, w_eff, keys, topk, scratch, stream, totals, map, scores.base,
                                scores.stride);
}

}  // namespace

void launch_indexer_topk_wgmma_overlap(const LayerDims& d, const DeviceMetadata& meta, const bf16* qi,
                                       const float* w_eff, const bf16* keys, std::int32_t* topk,
                                       void* scratch, cudaStream_t stream, const SelectedScores& scores,
                                       unsigned long long* totals) {
  require(indexer_tiled_supported(d), ErrorKind::Unsupported,
          "the wgmma indexer needs index_n_heads <= 64 and index_head_dim 64 or 128");
  require(scratch != nullptr, ErrorKind::InvalidArgument, "the wgmma indexer needs its scratch");
  // Two score slots a CTA: a card of more multiprocessors than half the scratch's slots takes
  // the two-warpgroup kernel (the same ids).
  if (2 * multiprocessor_count() > kIdxTiledMaxCtas) {
    launch_indexer_topk_wgmma(d, meta, qi, w_eff, keys, topk, scratch, stream, nullptr, scores);
    return;
  }
  if (d.index_dim == 128) launch_overlap<128>(d, meta, qi, w_eff, keys, topk, scratch, stream, scores, totals);
  else launch_overlap<64>(d, meta, qi, w_eff, keys, topk, scratch, stream, scores, totals);
}

}  // namespace csattn::cuda
