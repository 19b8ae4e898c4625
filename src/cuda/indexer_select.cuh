// A block-wide radix select of the top K of one row's fp32 scores (kept in global scratch),
// in three digits of the order key (11, 11, 10 bits) instead of four bytes, with warp
// scans in place of a serial bin loop, and the deterministic write: ids in ascending order,
// every key above the K-th largest, then the equal ones with the smallest ids, K entries.
// Identical selection to select_topk of indexer_topk.cu (the same threshold and tie rule).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/indexer_score.cuh"

namespace csattn::cuda::idxsel {

constexpr int kDigit0Bits = 11, kDigit1Bits = 11, kDigit2Bits = 10;
constexpr int kBins = 1 << 11;  // the largest digit's histogram
__device__ __forceinline__ unsigned digit0(unsigned key) { return key >> 21; }

// Shared state of one select (the caller gives it in shared memory).
struct SelectShared {
  int warp_total[32][2];
  int bin;
  int need;
};

// Who runs a select: G::kThreads threads, G::tid() the caller's index among them, G::sync()
// their barrier. BlockThreads: the whole CTA (__syncthreads). RowGroup: kN consecutive threads
// (whole warps), group threadIdx.x / kN meeting at named barrier kRowGroupBarrier0 + group, so
// several rows' selects run side by side, their barrier and L2 latencies overlapping.
template <int kN>
struct BlockThreads {
  static constexpr int kThreads = kN;
  static constexpr bool kOneWarp = false;  // (WarpThreads)
  __device__ static int tid() { return static_cast<int>(threadIdx.x); }
  __device__ static void sync() { __syncthreads(); }
};
// Ids 8 and up: the indexer kernels' own named barriers (1-7) are not touched by the selects.
constexpr int kRowGroupBarrier0 = 8;
template <int kN>
struct RowGroup {
  static_assert(kN % 32 == 0, "a row group is whole warps");
  static constexpr int kThreads = kN;
  static constexpr bool kOneWarp = false;  // (WarpThreads)
  __device__ static int tid() { return static_cast<int>(threadIdx.x) % kN; }
  __device__ static void sync() {
    asm volatile("bar.sync %0, %1;\n" ::"r"(kRowGroupBarrier0 + static_cast<int>(threadIdx.x) / kN), "n"(kN)
                 : "memory");
  }
};

// One warp (the overlapped wgmma indexer's selecting warpgroup: a row a warp); __syncwarp
// orders the lanes' shared-memory accesses like a barrier.
struct WarpThreads {
  static constexpr int kThreads = 32;
  // What one warp a row changes (kOneWarp): find_bin's lanes own 2048 / 32 consecutive bins,
  // read in order all 32 would hit one bank at once, so each lane starts at its own offset
  // (the sum does not change); a lane's share of a pass is 1/32 of the row, so the
  // histograms, which store between their loads (atomics), load four float4 ahead (one at a
  // time, a pass would be a chain of L2 latencies: ~38K cycles for an 8K-candidate row); and
  // the ids are written in one coalesced pass (write_ids_warp_scan).
  static constexpr bool kOneWarp = true;
  __device__ static int tid() { return static_cast<int>(threadIdx.x) & 31; }
  __device__ static void sync() { __syncwarp(); }
};

// Inclusive suffix sums over the block's threads (thread G::kThreads - 1 is the highest) of two
// counts at once; returns the sums of the threads strictly above in x/y of the result.
template <class G>
__device__ __forceinline__ int2 block_suffix_above(int a, int b, SelectShared& sh) {
  const int lane = G::tid() & 31, warp = G::tid() >> 5;
  int sa = a, sb = b;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int ua = __shfl_down_sync(0xffffffffu, sa, o), ub = __shfl_down_sync(0xffffffffu, sb, o);
    if (lane + o < 32) { sa += ua; sb += ub; }
  }
  G::sync();
  if (lane == 0) { sh.warp_total[warp][0] = sa; sh.warp_total[warp][1] = sb; }
  G::sync();
  int wa = 0, wb = 0;
  for (int w = warp + 1; w < G::kThreads / 32; ++w) { wa += sh.warp_total[w][0]; wb += sh.warp_total[w][1]; }
  return make_int2(sa - a + wa, sb - b + wb);
}

// Exclusive prefix sums (thread 0 first) of two counts at once.
template <class G>
__device__ __forceinline__ int2 block_prefix_before(int a, int b, SelectShared& sh) {
  const int lane = G::tid() & 31, warp = G::tid() >> 5;
  int sa = a, sb = b;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int ua = __shfl_up_sync(0xffffffffu, sa, o), ub = __shfl_up_sync(0xffffffffu, sb, o);
    if (lane >= o) { sa += ua; sb += ub; }
  }
  G::sync();
  if (lane == 31) { sh.warp_total[warp][0] = sa; sh.warp_total[warp][1] = sb; }
  G::sync();
  int wa = 0, wb = 0;
  for (int w = 0; w < warp; ++w) { wa += sh.warp_total[w][0]; wb += sh.warp_total[w][1]; }
  return make_int2(sa - a + wa, sb - b + wb);
}

// Finds, in hist[0..bins), the bin holding the need-th largest element (counting from the
// top bin): sh.bin, and sh.need = how many of that bin still to take. Each thread owns
// bins / G::kThreads consecutive bins. Ends with a barrier; sh is valid after it.
template <class G>
__device__ void find_bin(const unsigned* hist, int bins, int need, SelectShared& sh) {
  const int per = bins / G::kThreads;
  const int lo = G::tid() * per;
  int local = 0;
  if constexpr (G::kOneWarp) {  // per is a power of two (bins and kThreads are)
#pragma unroll 8  // (fully unrolled, its 64 loads in flight spilled the selecting warps)
    for (int i = 0; i < per; ++i) local += static_cast<int>(hist[lo + ((i + G::tid()) & (per - 1))]);
  } else {
    for (int i = 0; i < per; ++i) local += static_cast<int>(hist[lo + i]);
  }
  int above = block_suffix_above<G>(local, 0, sh).x;
  if (above < need && above + local >= need) {  // exactly one thread
    for (int i = per - 1; i >= 0; --i) {
      const int c = static_cast<int>(hist[lo + i]);
      if (above + c >= need) {
        sh.bin = lo + i;
        sh.need = need - above;
        break;
      }
      above += c;
    }
  }
  G::sync();
}

// Calls f(i, src[i]) for i = first, first + step, ... below end, in that order, with kAhead
// loads issued before the first of their calls. Where f stores (atomics, ids, a copy), the
// compiler cannot move the next load above it (the pointers may alias as far as it knows):
// one load at a time, a pass over a row in L2 is a chain of latencies.
template <int kAhead, class F>
__device__ __forceinline__ void for_each_float4(const float4* src, int first, int end, int step, F&& f) {
  for (int i0 = first; i0 < end; i0 += kAhead * step) {
    float4 v[kAhead];
#pragma unroll
    for (int k = 0; k < kAhead; ++k)
      if (i0 + k * step < end) v[k] = src[i0 + k * step];
#pragma unroll
    for (int k = 0; k < kAhead; ++k)
      if (i0 + k * step < end) f(i0 + k * step, v[k]);
  }
}

// Histogram of the digit at `shift` (bits wide) of the keys whose bits above shift + bits
// equal `prefix`'s; hist (kBins entries) is zeroed here first. kAll: every key counts (the
// first digit, where the scoring did not count it: the prefix test would shift by 32).
template <class G, bool kAll = false>
__device__ void digit_histogram(const float* scores, int n, unsigned prefix, int shift, int bits,
                                unsigned* hist) {
  for (int i = G::tid(); i < kBins; i += G::kThreads) hist[i] = 0u;
  G::sync();
  const unsigned high = shift + bits;  // bits of the key above the digit must match
  const unsigned digit_mask = (1u << bits) - 1u;
  const float4* s4 = reinterpret_cast<const float4*>(scores);
  const int n4 = (n + 3) / 4;
  auto count = [&](int i, const float4& v) {
    const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      if (4 * i + c >= n) break;
      const unsigned key = order_key(e[c]);
      if (kAll || (key >> high) == (prefix >> high)) atomicAdd(&hist[(key >> shift) & digit_mask], 1u);
    }
  };
  if constexpr (G::kOneWarp) {  // four loads in flight a lane (WarpThreads)
    for_each_float4<4>(s4, G::tid(), n4, G::kThreads, count);
  } else {  // (as measured for the other groups: written out, the lambda changed their code)
    for (int i = G::tid(); i < n4; i += G::kThreads) {
      const float4 v = s4[i];
      const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (4 * i + c >= n) break;
        const unsigned key = order_key(e[c]);
        if (kAll || (key >> high) == (prefix >> high)) atomicAdd(&hist[(key >> shift) & digit_mask], 1u);
      }
    }
  }
  G::sync();
}

// One warp's pass over a row in steps of kAhead x 32 float4s: f(i, v) for every lane and
// step, v = float4 i of the row (zeros past its n4 float4s: f tests 4 i + c < n), all the
// step's loads issued before its first call; the trip count is the warp's, so f may use
// full-mask warp collectives. Lane l's float4 of a step's k-th quarter holds entries
// 4 (s0 + 32 k + l) ..+ 3: lanes in id order, coalesced.
template <int kAhead, class F>
__device__ __forceinline__ void for_each_float4_warp(const float* scores, int n, F&& f) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const float4* s4 = reinterpret_cast<const float4*>(scores);
  const int n4 = (n + 3) / 4;
  for (int s0 = 0; s0 < n4; s0 += kAhead * 32) {
    float4 v[kAhead];
#pragma unroll
    for (int k = 0; k < kAhead; ++k) {
      const int i = s0 + 32 * k + lane;
      v[k] = i < n4 ? s4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int k = 0; k < kAhead; ++k) f(s0 + 32 * k + lane, v[k]);
  }
}

// One warp's second-digit histogram (select_topk_radix's one-warp path): the pass over
// the row that counts the second digit of the keys in the first digit's bin `bin0` also
// appends those keys to `kept` (shared memory, room for all of them: the caller checked the
// bin's count), so the third digit is counted from `kept` instead of another pass over the
// row in L2. A ballot a key position places the appends.
__device__ __forceinline__ void digit1_histogram_keeping(const float* scores, int n, unsigned bin0, unsigned* hist,
                                                         unsigned* kept) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  for (int i = lane; i < kBins; i += 32) hist[i] = 0u;
  __syncwarp();
  const unsigned below = (1u << lane) - 1u;
  int count = 0;  // keys kept so far (warp-uniform)
  for_each_float4_warp<4>(scores, n, [&](int i, const float4& v) {
    const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const unsigned key = order_key(e[c]);
      const bool in_bin = 4 * i + c < n && digit0(key) == bin0;
      const unsigned ballot = __ballot_sync(0xffffffffu, in_bin);
      if (in_bin) {
        atomicAdd(&hist[(key >> kDigit2Bits) & ((1u << kDigit1Bits) - 1u)], 1u);
        kept[count + __popc(ballot & below)] = key;
      }
      count += __popc(ballot);
    }
  });
  __syncwarp();
}

// The third digit's histogram over the m keys `kept` by digit1_histogram_keeping (all in the
// first digit's bin): those whose second digit is prefix's.
__device__ __forceinline__ void digit2_histogram_kept(const unsigned* kept, int m, unsigned prefix, unsigned* hist) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  for (int i = lane; i < (1 << kDigit2Bits); i += 32) hist[i] = 0u;
  __syncwarp();
  for (int i = lane; i < m; i += 32) {
    const unsigned key = kept[i];
    if ((key >> kDigit2Bits) == (prefix >> kDigit2Bits)) atomicAdd(&hist[key & ((1u << kDigit2Bits) - 1u)], 1u);
  }
  __syncwarp();
}

// One warp's id writes in a single pass (select_topk_radix with WarpThreads): steps of 128 entries,
// lane l's float4 holding entries 4l .. 4l + 3 of its step (coalesced, four steps' loads in
// flight), each step's ranks from one warp scan of the lane's counts of keys above and equal
// to the threshold, packed in 16-bit halves: the equal keys are taken in id order, the first
// need_equal - (equal keys before) of them. The same ids in the same slots as the counting
// pass and the chunked writes of the other groups. Measured (H100, 2026-12-06, perf.md
// sixteenth session) against those two passes by one warp - each lane's contiguous chunk, 32
// cache lines a warp load, the counting pass one load at a time: the one-warp select 156K ->
// 138K cycles a block at 32K tokens, the overlapped indexer +7-13% at 32K-128K tokens.
template <bool kScores>
__device__ __forceinline__ void write_ids_warp_scan(const float* scores, int n, unsigned threshold, int need_equal,
                                                    std::int32_t* out, float* out_scores, int score_stride) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  int base = 0, equal_base = 0;  // slots taken and equal keys seen before the step (warp-uniform)
  for_each_float4_warp<4>(scores, n, [&](int i, const float4& v) {
    const float e[4] = {v.x, v.y, v.z, v.w};
    unsigned above = 0u, equal = 0u;  // bit c: entry 4i + c
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const unsigned key = order_key(e[c]);
      const bool real = 4 * i + c < n;
      above |= static_cast<unsigned>(real && key > threshold) << c;
      equal |= static_cast<unsigned>(real && key == threshold) << c;
    }
    // Inclusive scan of (above count) << 16 | (equal count) over the lanes.
    const int mine = (__popc(above) << 16) | __popc(equal);
    int incl = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int u = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += u;
    }
    const int total = __shfl_sync(0xffffffffu, incl, 31);
    const int before = incl - mine;
    const int equal_before = equal_base + (before & 0xffff);
    // Equal keys still to take when this lane's turn comes, and the lane's first slot.
    int left = need_equal - equal_before;
    int slot = base + (before >> 16) + min(before & 0xffff, max(0, need_equal - equal_base));
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      bool take = (above >> c) & 1u;
      if ((equal >> c) & 1u) take = left-- > 0;
      if (take) {
        if constexpr (kScores) out_scores[static_cast<long>(slot) * score_stride] = e[c];
        out[slot++] = 4 * i + c;
      }
    }
    base += (total >> 16) + min(total & 0xffff, max(0, need_equal - equal_base));
    equal_base += total & 0xffff;
  });
}

// Selects the top K of scores[0..n) (n > K; scores 16-byte aligned) and writes their ids in
// ascending order to out[0..K). hist (kBins entries, shared) holds on entry the histogram of
// digit0 over all n keys (built while scoring, or by digit_histogram's kAll); it is
// overwritten. kScores: the selected ids' scores too, out_scores[k * score_stride] beside
// out[k] (a compile-time choice: a null test at run time made the select of the instances
// without scores 4.6% slower, 3-6% of the indexer, H100 2026-12-06). One warp (WarpThreads)
// writes the ids by write_ids_warp_scan, without the counting pass. mark(p) (measurement
// hooks, no-ops by default): p = 1 after the second digit's histogram, 2 after the third's,
// 3 the threshold found, 4 the ranks counted (not by one warp), 5 the ids written.
// One warp (the overlapped indexer's selecting warps, its only caller) also keeps the first
// digit's bin where it holds at most kept_cap keys: in `kept` (shared memory), during the
// second digit's pass, and counts the third digit from there (digit1_histogram_keeping,
// digit2_histogram_kept); the same threshold.
struct NoMark {
  __device__ void operator()(int) const {}
};
template <class G, bool kScores = false, class Mark = NoMark>
__device__ void select_topk_radix(const float* scores, int n, int K, unsigned* hist,
                                  SelectShared& sh, std::int32_t* out, bool odd_chunks = false,
                                  float* out_scores = nullptr, int score_stride = 1, Mark mark = {},
                                  unsigned* kept = nullptr, int kept_cap = 0) {
  constexpr bool kCompact = G::kOneWarp;  // the first digit's bin kept (above)
  find_bin<G>(hist, 1 << kDigit0Bits, K, sh);
  unsigned prefix = static_cast<unsigned>(sh.bin) << (kDigit1Bits + kDigit2Bits);
  int need = sh.need;
  [[maybe_unused]] int in_bin = 0;  // kCompact: the first digit's bin's keys (the histogram's count)
  if constexpr (kCompact) in_bin = static_cast<int>(hist[sh.bin]);
  G::sync();  // everyone has read sh before it is rewritten
  [[maybe_unused]] bool keeping = false;
  if constexpr (kCompact) keeping = in_bin <= kept_cap;
  if constexpr (kCompact) {
    if (keeping) digit1_histogram_keeping(scores, n, prefix >> (kDigit1Bits + kDigit2Bits), hist, kept);
    else digit_histogram<G>(scores, n, prefix, kDigit2Bits, kDigit1Bits, hist);
  } else {
    digit_histogram<G>(scores, n, prefix, kDigit2Bits, kDigit1Bits, hist);
  }
  mark(1);
  find_bin<G>(hist, 1 << kDigit1Bits, need, sh);
  prefix |= static_cast<unsigned>(sh.bin) << kDigit2Bits;
  need = sh.need;
  G::sync();
  if constexpr (kCompact) {
    if (keeping) digit2_histogram_kept(kept, in_bin, prefix, hist);
    else digit_histogram<G>(scores, n, prefix, 0, kDigit2Bits, hist);
  } else {
    digit_histogram<G>(scores, n, prefix, 0, kDigit2Bits, hist);
  }
  mark(2);
  find_bin<G>(hist, 1 << kDigit2Bits, need, sh);
  const unsigned threshold = prefix | static_cast<unsigned>(sh.bin);
  const int need_equal = sh.need;
  mark(3);
  if constexpr (G::kOneWarp) {
    write_ids_warp_scan<kScores>(scores, n, threshold, need_equal, out, out_scores, score_stride);
  } else {
    // Each thread owns a contiguous chunk (a multiple of 4 entries), so ranks follow id order:
    // count the keys above and equal to the threshold, prefix both over the block, write.
    // odd_chunks (scores in shared memory): an odd number of float4s a chunk, so the 8 threads
    // of a quarter-warp read 8 distinct bank groups, where an even stride conflicts up to 8-way
    // (chunk = 32 k floats). The ids do not depend on the split.
    const int chunk4 = ((n + G::kThreads - 1) / G::kThreads + 3) / 4;
    const int chunk = (odd_chunks ? chunk4 | 1 : chunk4) * 4;
    const int lo = min(n, G::tid() * chunk), hi = min(n, lo + chunk);
    int greater = 0, equal = 0;
    for (int j = lo; j < hi; j += 4) {
      const float4 v = *reinterpret_cast<const float4*>(scores + j);
      const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (j + c >= hi) break;
        const unsigned key = order_key(e[c]);
        greater += key > threshold;
        equal += key == threshold;
      }
    }
    const int2 before = block_prefix_before<G>(greater, equal, sh);
    mark(4);
    int slot = before.x + min(before.y, need_equal);
    int equal_rank = before.y;
    for (int j = lo; j < hi; j += 4) {
      const float4 v = *reinterpret_cast<const float4*>(scores + j);
      const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (j + c >= hi) break;
        const unsigned key = order_key(e[c]);
        bool take = key > threshold;
        if (key == threshold) take = equal_rank++ < need_equal;
        if (take) {
          if constexpr (kScores) out_scores[static_cast<long>(slot) * score_stride] = e[c];
          out[slot++] = j + c;
        }
      }
    }
  }
  mark(5);
  G::sync();  // hist and sh are reused by the next row
}

}  // namespace csattn::cuda::idxsel
