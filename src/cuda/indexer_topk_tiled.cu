// The tiled lightning indexer: kIdxTiledRows consecutive query rows per CTA share every key
// tile (loaded once, cp.async, 3 stages), scored on tensor cores with the keys as the MMA's
// A (16 keys x 16 dims from shared memory) and the query as its B, held in registers for
// the whole row (a warp owns one row and 32 of its heads: DI/16 k-steps x 4 head tiles x 2
// registers). Heads as the MMA's N put the head sum inside a thread plus two shuffles. The
// sum follows the tree of the one-row kernel (indexer_topk.cu) bit for bit: per 16-head
// group g0..7 pairs (h, h+8) through head_pair_term, a butterfly over the 8 pairs, then the
// four groups left to right. Scores go to a per-CTA slot of global scratch (persistent
// CTAs, so its size is bounded by the grid, not by T) while the first radix digit's
// histogram is built in shared memory; then a three-digit radix select per row
// (indexer_select.cuh).
#include <algorithm>

#include "cuda/check.hpp"
#include "cuda/device_util.cuh"
#include "cuda/indexer_block.cuh"
#include "cuda/indexer_score.cuh"
#include "cuda/indexer_topk_plan.hpp"
#include "cuda/indexer_topk_tiled.hpp"
#include "cuda/mma_util.cuh"

namespace csattn::cuda {

namespace {

constexpr int kThreads = 256;  // 8 warps: row r = warp / 2, head half = warp % 2
constexpr int kRows = idxblock::kRows;
static_assert(kThreads / 64 == kRows, "two warps per query row");
constexpr int kKeys = 64;      // keys per tile
constexpr int kStages = 3;

__device__ __forceinline__ int swz(int row, int chunk, int row_bytes) {
  return row * row_bytes + ((chunk ^ (row & 7)) << 4);
}

// The two warps of row r meet without stopping the other rows (ids 1..4; 0 is __syncthreads).
__device__ __forceinline__ void pair_barrier(int r) {
  asm volatile("bar.sync %0, 64;\n" ::"r"(r + 1) : "memory");
}

template <int DI>
__global__ void __launch_bounds__(kThreads, 2)
    indexer_topk_tiled_kernel(LayerDims d, DeviceMetadata meta, const bf16* qi, const float* w_eff,
                              const bf16* keys, std::int32_t* topk, unsigned* counter,
                              float* slots, long row_stride) {
  constexpr int kRowBytes = DI * 2, kChunks = DI / 8, kSteps = DI / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* k_s = smem;                                              // kStages x [64, DI]
  unsigned* hist = reinterpret_cast<unsigned*>(k_s + kStages * kKeys * kRowBytes);  // [kRows, 2048]
  float* part = reinterpret_cast<float*>(hist + kRows * idxsel::kBins);   // [kRows, 3, 64]
  float* w_s = part + kRows * 3 * kKeys;                                  // [kRows, 64]
  __shared__ idxsel::SelectShared sel[1];
  __shared__ idxblock::Shared sh;

  const int HI = d.index_heads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r = warp >> 1, half = warp & 1, g = lane >> 2, q = lane & 3;
  float* slot = slots + static_cast<long>(blockIdx.x) * kRows * row_stride;

  int t0 = 0;
  unsigned todo = 0;
  while (idxblock::next_block<kThreads>(d, meta, counter, topk, hist, sh, t0, todo)) {
    const unsigned selecting = todo;
    while (todo != 0u) {
      int run_seg = 0, n_run = 0;
      const unsigned run = idxblock::take_run(todo, sh, run_seg, n_run);
      const bool active = run >> r & 1u;
      const int n_row = sh.n[r];
      const bf16* seg_keys = keys + static_cast<long>(meta.comp_start[run_seg]) * DI;

      // This warp's query fragments (B of m16n8k16: k = dims 2q.., n = head g of the tile),
      // heads 32 * half + 8 * nt + g; the row's head weights go to shared memory.
      std::uint32_t bq[kSteps][4][2];
      if (active) {
        const long t = t0 + r;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int h = 32 * half + 8 * nt + g;
          const std::uint32_t* src =
              reinterpret_cast<const std::uint32_t*>(qi + (t * HI + min(h, HI - 1)) * DI) + q;
#pragma unroll
          for (int ks = 0; ks < kSteps; ++ks) {
            bq[ks][nt][0] = h < HI ? src[8 * ks] : 0u;
            bq[ks][nt][1] = h < HI ? src[8 * ks + 4] : 0u;
          }
        }
        if (lane < 32) {
          const int h = 32 * half + lane;
          w_s[r * 64 + h] = h < HI ? w_eff[t * HI + h] : 0.0f;
        }
      }

      auto load_tile = [&](int tile) {
        if (tile * kKeys < n_run) {
          unsigned char* base = k_s + (tile % kStages) * kKeys * kRowBytes;
          for (int i = tid; i < kKeys * kChunks; i += kThreads) {
            const int kr = i / kChunks, c = i % kChunks;
            const int j = min(tile * kKeys + kr, n_run - 1);  // past the end: a real key, unused
            cp_async_16(smem_addr(base + swz(kr, c, kRowBytes)), seg_keys + static_cast<long>(j) * DI + c * 8);
          }
        }
        cp_async_commit();  // always a group (maybe empty): the wait count stays uniform
      };
      const int tiles = (n_run + kKeys - 1) / kKeys;
      __syncthreads();  // the stages of the previous run are free
      load_tile(0);
      load_tile(1);
      for (int tile = 0; tile < tiles; ++tile) {
        cp_async_wait<1>();
        __syncthreads();  // tile's stage has landed; tile - 1's stage and `part` are free
        load_tile(tile + 2);
        if (active) {
          const unsigned char* kb = k_s + (tile % kStages) * kKeys * kRowBytes;
          float* my_part = part + r * 3 * kKeys;
          const float* wr = w_s + r * 64 + 32 * half + 2 * q;  // wr[8 nt + c]
#pragma unroll 1
          for (int mt = 0; mt < kKeys / 16; ++mt) {
            float acc[4][4];
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < kSteps; ++ks) {
              std::uint32_t a[4];
              ldmatrix_x4(smem_addr(kb + swz(16 * mt + (lane & 15), 2 * ks + (lane >> 4), kRowBytes)), a);
#pragma unroll
              for (int nt = 0; nt < 4; ++nt) mma_bf16(acc[nt], a, bq[ks][nt][0], bq[ks][nt][1]);
            }
            // acc[nt][2i + c] = S[key 16mt + g + 8i][head 32 half + 8 nt + 2q + c]. Group
            // 2 half + wg holds heads 16 (2 half + wg) + {2q + c, 2q + c + 8} in nt = 2wg, 2wg + 1.
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              float grp[2];
#pragma unroll
              for (int wg = 0; wg < 2; ++wg) {
                const float2 w0 = *reinterpret_cast<const float2*>(wr + 16 * wg);      // heads h, h + 1
                const float2 w8 = *reinterpret_cast<const float2*>(wr + 16 * wg + 8);  // h + 8, h + 9
                float v = head_pair_term(w0.x, acc[2 * wg][2 * i], w8.x, acc[2 * wg + 1][2 * i]) +
                          head_pair_term(w0.y, acc[2 * wg][2 * i + 1], w8.y, acc[2 * wg + 1][2 * i + 1]);
                v += __shfl_xor_sync(0xffffffffu, v, 1);
                v += __shfl_xor_sync(0xffffffffu, v, 2);
                grp[wg] = v;
              }
              const int key = 16 * mt + g + 8 * i;
              if (q == 0) {
                if (half == 0) {
                  my_part[key] = grp[0] + grp[1];
                } else {
                  my_part[kKeys + key] = grp[0];
                  my_part[2 * kKeys + key] = grp[1];
                }
              }
            }
          }
          pair_barrier(r);
          // ((T0 + T1) + T2) + T3, one key per thread of the pair: coalesced score writes.
          const int k = 32 * half + lane, j = tile * kKeys + k;
          if (j < n_row) {
            const float s = (my_part[k] + my_part[kKeys + k]) + my_part[2 * kKeys + k];
            slot[r * row_stride + j] = s;
            atomicAdd(&hist[r * idxsel::kBins + idxsel::digit0(order_key(s))], 1u);
          }
        }
      }
      cp_async_wait<0>();
    }
    // The rows one after another (the side-by-side select's code would push this kernel past
    // its 128 registers: a spill).
    idxblock::select_block<kThreads, false>(d, selecting, sh, t0, slot, row_stride, hist, sel, topk);
  }
}

template <int DI>
std::size_t tiled_smem_bytes() {
  return static_cast<std::size_t>(kStages) * kKeys * DI * 2 + sizeof(unsigned) * kRows * idxsel::kBins +
         sizeof(float) * kRows * (3 * kKeys + 64);
}

template <int DI>
void launch_tiled(const LayerDims& d, const DeviceMetadata& meta, const bf16* qi, const float* w_eff,
                  const bf16* keys, std::int32_t* topk, void* scratch, cudaStream_t stream) {
  // Two CTAs per SM (their shared memory allows two).
  idxblock::launch_block_kernel(indexer_topk_tiled_kernel<DI>, kThreads, 2, tiled_smem_bytes<DI>(),
                                "the tiled CUDA indexer", d, meta, qi, w_eff, keys, topk, scratch, stream);
}

}  // namespace

void launch_indexer_topk_tiled(const LayerDims& d, const DeviceMetadata& meta, const bf16* qi,
                               const float* w_eff, const bf16* keys, std::int32_t* topk,
                               void* scratch, cudaStream_t stream) {
  require(indexer_tiled_supported(d), ErrorKind::Unsupported,
          "the tiled CUDA indexer needs index_n_heads <= 64 and index_head_dim 64 or 128");
  require(scratch != nullptr, ErrorKind::InvalidArgument, "the tiled CUDA indexer needs its scratch");
  if (d.index_dim == 128) launch_tiled<128>(d, meta, qi, w_eff, keys, topk, scratch, stream);
  else launch_tiled<64>(d, meta, qi, w_eff, keys, topk, scratch, stream);
}

}  // namespace csattn::cuda
