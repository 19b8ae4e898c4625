// The indexer KL loss on tensor cores (head_dim 512, index_head_dim 128, up to 64 index
// heads and 128 heads: the DeepSeek-V4 Flash and Pro shapes). Same contract as the baseline
// in indexer_loss.cu (its header states the math).
//
// One CTA per query row, eight warps, candidates in tiles of 32 gathered with cp.async into
// swizzled double-buffered shared memory (main compressed rows [32 x 512], indexer keys
// [32 x 128]):
//  - teacher logits Z = Q K^T: Q [64 heads x 512] of the row lives in registers as MMA A
//    fragments; warp (wr, hh) computes heads 16wr..16wr+15 over dims [256hh, 256hh+256) for
//    all 32 keys, the two dim halves are summed through shared memory (each warp then owns
//    16 heads x 16 keys);
//  - predictor scores S = qI K^I^T ([64 x 128] x [128 x 32]), warp (wr, hh) the same
//    16 heads x 16 keys, then ReLU, w' and the head sum (fixed order: lanes, then 4 warps);
//  - gradients: G[h, j] = g_j w'_h 1[S > 0] (bf16, in shared memory as [key][head]),
//    dqI += G K^I and dK^I = G^T qI as MMAs, dw' += g_j ReLU(S) in registers; dK^I leaves
//    through add_key_grads_lines (fast mode) or store_key_grad (deterministic mode;
//    indexer_loss_keygrad.cuh), everything else is summed in a fixed
//    order (bitwise repeatable per row).
// The sparse loss computes its predictor logits I once, in its first candidate pass, and the
// final pass reads them back: with predictor operands (a.pred_qi / a.pred_keys, the MXFP8
// indexer's) that first pass scores those, and qI is reloaded from a.qi before the final
// pass, whose S (ReLU masks, products) comes from a.qi / a.keys.
// More than 64 heads (written 2026-12-04 without a GPU, tested against the baseline, not yet
// run): the teacher's heads go in groups of 64, one group's Q in the registers at a time.
// The teacher enters the loss only through each candidate's head-summed mass, which adds
// over groups: the sparse loss accumulates its stored masses group by group (the statistics,
// where needed, per group first) and the final pass reads them; the dense loss, which stores
// nothing per candidate, takes its statistics per group, and its final pass computes each
// tile's teacher for both groups, reloading the group's Q (L1 / L2) between them.
// Passes over the candidates (no per-row cap on their number; only the sparse loss keeps
// per-candidate values, top-k of them):
//  - sparse loss with the forward's LSE (sink + window + top-k = exactly this loss's
//    denominator when every valid id is visible): one teacher pass storing the head-summed
//    mass and the index score of each candidate; the gradient pass recomputes only S (for
//    the gradients: the values come from the stored scores).
//  - dense loss (denominator: sink + window + ALL visible entries, which the attention's LSE
//    does not cover), or a sparse row whose top-k holds an id the loss drops: a window pass
//    and a candidate pass for the per-head (max, sum) statistics and the predictor's, then a
//    pass recomputing Z (now normalised: P = exp(Z - LSE_h)) and S for the values and
//    gradients. The teacher's L1 denominator sum_j sum_h P_h(j) = sum_h exp(LSEc_h - LSE_h)
//    (LSEc: candidates only) comes from the statistics, so the last pass needs nothing else.
// Kept values (launch_indexer_loss's `kept`, the layer's forward and backward): a sparse row
// that stores its masses has, before its final pass, each candidate's teacher mass and
// predictor logit and the row's two sums - all the final pass reads. The value launch (the
// forward) stores them; the gradient launch (the backward) loads them and runs the final pass
// alone, so the backward never recomputes the teacher's Q K^T over 512 dims (1 KB gathered a
// candidate), only the indexer's scores for the gradients (256 B a candidate).
#include <cfloat>
#include <cmath>

#include "cuda/attention_keys.cuh"
#include "cuda/backward_kernels.hpp"
#include "cuda/check.hpp"
#include "cuda/device_util.cuh"
#include "cuda/indexer_loss_keygrad.cuh"
#include "cuda/mma_util.cuh"

namespace csattn::cuda {

namespace {

constexpr int kHeads = 64;    // teacher head rows per group (rows past H are zero, masked)
constexpr int kGroups = 2;    // head groups at most
constexpr int kDim = 512;
constexpr int kIdxHeads = 64; // index head rows (rows past H_I are zero, weight 0)
constexpr int kIdxDim = 128;
constexpr int kKeys = 32;     // candidates per tile
constexpr int kThreads = 256;
constexpr int kWideRow = kDim * 2;     // bytes of one main compressed / kv row
constexpr int kIdxRow = kIdxDim * 2;   // bytes of one indexer key / qI row
constexpr int kGRow = kIdxHeads * 2;   // bytes of one G^T row ([key][head] bf16)
constexpr float kLog2e = 1.4426950408889634f;

// Byte offset of 16-byte chunk `chunk` of `row` in a swizzled tile: the XOR spreads the 8
// rows one ldmatrix reads at the same logical chunk over 8 bank groups.
__device__ __forceinline__ int swz(int row, int chunk, int row_bytes) {
  return row * row_bytes + ((chunk ^ (row & 7)) << 4);
}

struct SmemLayout {
  static constexpr int wide = 0;                                  // 2 x [32, 512] bf16
  static constexpr int ikeys = wide + 2 * kKeys * kWideRow;       // 2 x [32, 128] bf16
  static constexpr int qi = ikeys + 2 * kKeys * kIdxRow;          // [64, 128] bf16
  static constexpr int gt = qi + kIdxHeads * kIdxRow;             // [32, 64] bf16 (G^T)
  static constexpr int xs = gt + kKeys * kGRow;                   // [8 warps, 8, 32] f32
  static constexpr int part_t = xs + 8 * 8 * 32 * 4;              // [2 groups, 4, 32] f32
  static constexpr int part_i = part_t + kGroups * 4 * kKeys * 4; // [4, 32] f32
  static constexpr int gk = part_i + 4 * kKeys * 4;               // [32] f32
  static constexpr int w = gk + kKeys * 4;                        // [64] f32
  static constexpr int lse2 = w + kIdxHeads * 4;                  // [2 groups, 64] f32 (log2)
  static constexpr int ratio = lse2 + kGroups * kHeads * 4;       // [2 groups, 64] f32
  static constexpr int stats = ratio + kGroups * kHeads * 4;      // [2 halves, 64, 2] f32
  static constexpr int src_stats = stats + 2 * kHeads * 2 * 4;    // [2 sources, 64, 2] f32
  static constexpr int dwp = src_stats + 2 * kHeads * 2 * 4;      // [2, 64] f32
  static constexpr int fixed = dwp + 2 * kIdxHeads * 4;
  // then, sparse loss only: cand [K] int, mass [K] f32, logit [K] f32
};

// kGradOnly (the gradient launch of rows whose forward kept their values): no teacher tiles,
// the layout from `ikeys` on.
constexpr int layout_base(bool grad_only) { return grad_only ? SmemLayout::ikeys : 0; }

std::size_t mma_smem_bytes(const LayerDims& d, bool sparse, bool grad_only = false) {
  return SmemLayout::fixed - layout_base(grad_only) + (sparse ? 12ull * static_cast<std::size_t>(d.topk) : 0);
}

// (m, l) of an online log2-domain sum: merge another partial into it.
__device__ __forceinline__ void merge_stats(float& m, float& l, float mo, float lo) {
  const float mn = fmaxf(m, mo);
  if (mn == -INFINITY) return;
  l = l * exp2f(m - mn) + lo * exp2f(mo - mn);
  m = mn;
}

// Partial teacher logits of one warp: 16 head rows x 32 keys over its 256 dims.
__device__ __forceinline__ void teacher_tile(const std::uint32_t (&qf)[16][4],
                                             const unsigned char* tile, int hh, int lane,
                                             float (&s)[4][4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < 16; ++ks) {
    const int chunk = (hh * 256 + ks * 16) / 8 + ((lane >> 3) & 1);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      std::uint32_t bk[4];
      const int key = 16 * nt + (lane & 7) + ((lane >> 4) << 3);
      ldmatrix_x4(smem_addr(tile + swz(key, chunk, kWideRow)), bk);
      mma_bf16(s[2 * nt], qf[ks], bk[0], bk[1]);
      mma_bf16(s[2 * nt + 1], qf[ks], bk[2], bk[3]);
    }
  }
}

// Predictor scores of one warp: index heads 16wr.. x keys 16hh..16hh+15 over all 128 dims.
__device__ __forceinline__ void predictor_tile(const unsigned char* qi_s, const unsigned char* tile,
                                               int wr, int hh, int lane, float (&si)[2][4]) {
#pragma unroll
  for (int j = 0; j < 2; ++j) si[j][0] = si[j][1] = si[j][2] = si[j][3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < kIdxDim / 16; ++ks) {
    std::uint32_t a[4], bk[4];
    ldmatrix_x4(smem_addr(qi_s + swz(16 * wr + (lane & 15), 2 * ks + (lane >> 4), kIdxRow)), a);
    const int key = 16 * hh + (lane & 7) + ((lane >> 4) << 3);
    ldmatrix_x4(smem_addr(tile + swz(key, 2 * ks + ((lane >> 3) & 1), kIdxRow)), bk);
    mma_bf16(si[0], a, bk[0], bk[1]);
    mma_bf16(si[1], a, bk[2], bk[3]);
  }
}

// Sum over the warp's 16 head rows of v[j][i] (rows g / g+8, key 8j + 2q + (i & 1) of the
// warp's 16): lanes with the same q hold the same keys. Lanes 0-3 write part[key].
__device__ __forceinline__ void head_sum_to(const float (&v)[2][4], int lane, float* part) {
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      float x = v[j][c] + v[j][2 + c];
      x += __shfl_xor_sync(0xffffffffu, x, 4);
      x += __shfl_xor_sync(0xffffffffu, x, 8);
      x += __shfl_xor_sync(0xffffffffu, x, 16);
      if (lane < 4) part[8 * j + 2 * lane + c] = x;
    }
}

// One logit x into a running (max m, sum l) of exp, natural log: the predictor's LSE, key by
// key in the order its pass takes them.
__device__ __forceinline__ void lse_add(float& m, float& l, float x) {
  const float mn = fmaxf(m, x);
  l = l * expf(m - mn) + expf(x - mn);
  m = mn;
}

// The KL term of a candidate: teacher probability tj against the predictor's log-probability.
__device__ __forceinline__ float kl_term(float tj, float logp) { return tj * (logf(fmaxf(tj, 1e-10f)) - logp); }

// The predictor's (max, sum) of the warp's lanes merged by an xor butterfly, natural log;
// lane 0's result is the one kept (a partner pair may round its fma differently).
__device__ __forceinline__ void merge_lse_lanes(float& m, float& l) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float mo = __shfl_xor_sync(0xffffffffu, m, o), lo = __shfl_xor_sync(0xffffffffu, l, o);
    const float mn = fmaxf(m, mo);
    if (mn != -INFINITY) {
      l = l * expf(m - mn) + lo * expf(mo - mn);
      m = mn;
    }
  }
}

enum class Teach { none, stats, mass };

// kMaxGroups: 1 (up to 64 heads) or kGroups (past 64 heads); the one-group instance keeps the
// registers of a kernel without groups (the group loops fold away). The fast mode's dK^I
// leaves by whole lines (add_key_grads_lines: measured 1.5-4% faster gradient launches than
// float2 atomics, perf.md fifteenth session), the deterministic mode's into its scratch.
// kGradOnly (with kMaxGroups 1, for any head count; launch flag kKeptGradients): the gradient
// launch of the sparse loss whose every row reads its kept values and runs the final pass
// alone. Without the teacher's code (its Q fragments alone are 64 registers; the general
// instances take 244-255) and its tiles (64 KB), two CTAs share a multiprocessor: the
// general instance runs one 8-warp CTA an SM, whose tile loop of five CTA barriers, a
// one-warp KL step and 48 small MMAs a warp takes ~3x the MMAs' own time (perf.md
// seventeenth session). The same code in the same order: the same bits as the general
// instance. A row that would need the teacher (a top-k id the loss drops; the caller's
// contract says none) gets NaN in its loss and gradients.
template <int kMaxGroups, bool kGradOnly = false>
__global__ void __launch_bounds__(kThreads, kGradOnly ? 2 : 1)
    indexer_loss_mma_kernel(LayerDims d, DeviceMetadata meta, IndexerLossArgs a,
                            float* loss_rows, bool grads, float grad_loss, bf16* dqi_out,
                            float* dweff, float* dkeys_acc, float* kept_buf, int given_flags) {
  static_assert(!kGradOnly || kMaxGroups == 1, "the gradient-only instance has no teacher groups");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // (kGradOnly: `wide` is not there; wide_s is never used.)
  unsigned char* smem = smem_raw - layout_base(kGradOnly);
  unsigned char* wide_s = smem + SmemLayout::wide;
  unsigned char* ik_s = smem + SmemLayout::ikeys;
  unsigned char* qi_s = smem + SmemLayout::qi;
  unsigned char* gt_s = smem + SmemLayout::gt;
  float* xs = reinterpret_cast<float*>(smem + SmemLayout::xs);
  float* part_t = reinterpret_cast<float*>(smem + SmemLayout::part_t);
  float* part_i = reinterpret_cast<float*>(smem + SmemLayout::part_i);
  float* gk_s = reinterpret_cast<float*>(smem + SmemLayout::gk);
  float* w_s = reinterpret_cast<float*>(smem + SmemLayout::w);
  float* lse2_s = reinterpret_cast<float*>(smem + SmemLayout::lse2);
  float* ratio_s = reinterpret_cast<float*>(smem + SmemLayout::ratio);
  float* stats_s = reinterpret_cast<float*>(smem + SmemLayout::stats);
  float* src_stats = reinterpret_cast<float*>(smem + SmemLayout::src_stats);
  float* dwp = reinterpret_cast<float*>(smem + SmemLayout::dwp);
  int* cand_s = reinterpret_cast<int*>(smem + SmemLayout::fixed);
  float* mass_arr = reinterpret_cast<float*>(cand_s + (a.sparse ? d.topk : 0));
  float* logit_arr = mass_arr + (a.sparse ? d.topk : 0);
  __shared__ int n_shared, drop_shared;
  __shared__ int warp_counts[kThreads / 32];
  __shared__ float grad_scale_s;
  __shared__ float scal[2];  // tsum, ilse

  const int H = d.heads, HI = d.index_heads;
  const int t = a.chunk.r0 + static_cast<int>(blockIdx.x), tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wr = warp & 3, hh = warp >> 2, g = lane >> 2, qd = lane & 3;
  const int b = meta.row_segment[t], pos = meta.row_position[t];
  const int vis = meta.row_is_padding[t]
                      ? 0
                      : min((pos + 1) / d.ratio, meta.comp_start[b + 1] - meta.comp_start[b]);
  // kGivenLight: a value-launch row whose masses and
  // logits are both given (the layer's rows with more visible entries than K: the indexer's
  // K ids, all visible) needs only its KL from `kept` - warp 0 forms it there and the CTA
  // leaves, skipping the candidates' compaction, qI's load and the final pass's tile loop
  // (~12 us a row at 1 CTA an SM: ~6 ms at CSA 64K, perf.md fifteenth session). Everything
  // in the order of the logits_given branch and the final pass below, lane 0's sums shared
  // as scal[] shares them: the same bits in the loss row and in `kept`. The row's top-k ids
  // are not read: the caller's contract (backward_kernels.hpp, kGivenLight).
  if (!kGradOnly && (given_flags & kGivenLight) && !grads && a.sparse && kept_buf != nullptr && vis > d.topk) {
    if (warp != 0) return;
    const float* kc = kept_buf + static_cast<long>(t) * d.topk * 2;
    float lm = -INFINITY, ll = 0.0f, macc = 0.0f;
#pragma unroll 8  // (loads only: eight (mass, logit) pairs in flight a lane)
    for (int j = lane; j < d.topk; j += 32) {
      const float2 v = *reinterpret_cast<const float2*>(kc + 2 * j);
      lse_add(lm, ll, v.y);
      macc += v.x;
    }
    const float tsum = __shfl_sync(0xffffffffu, fmaxf(warp_sum(macc), FLT_MIN), 0);
    merge_lse_lanes(lm, ll);
    // Lane 0's, as scal[1]: the butterfly's two partners may round their fma differently.
    const float lse = __shfl_sync(0xffffffffu, lm + logf(ll), 0);
    float row_kl = 0.0f;
#pragma unroll 8
    for (int j = lane; j < d.topk; j += 32) {
      const float2 v = *reinterpret_cast<const float2*>(kc + 2 * j);
      const float tj = v.x / tsum;
      const float logp = fmaxf(v.y - lse, logf(FLT_MIN));  // the compact softmax's clamp
      row_kl += kl_term(tj, logp);
    }
    row_kl = warp_sum(row_kl);
    if (lane == 0) {
      loss_rows[t] = row_kl;
      kept_buf[(static_cast<long>(d.rows) * d.topk + t) * 2] = tsum;
      kept_buf[(static_cast<long>(d.rows) * d.topk + t) * 2 + 1] = lse;
    }
    return;
  }
  // The candidates: the top-k row's visible ids in order (a block-wide ballot compaction; a
  // thread-0 loop over the row cost microseconds a row); `drop`: the row holds an id the
  // loss drops - in the attention's denominator, not in this loss's.
  if (a.sparse) {
    const std::int32_t* sel = a.topk + static_cast<long>(t) * d.topk;
    int drop = 0;
    for (int k = tid; k < d.topk; k += kThreads) drop |= sel[k] >= vis;
    drop = __syncthreads_or(drop);
    const int c = compact_ids_if<kThreads>(sel, d.topk, cand_s, warp_counts, [] { __syncthreads(); },
                                           [vis](int id) { return id >= 0 && id < vis; });
    if (tid == 0) {
      n_shared = c;
      drop_shared = drop;
    }
  } else if (tid == 0) {
    n_shared = vis;
    drop_shared = 0;
  }
  if (tid == 0)  // the batch's scale (device: a graph replay's own), kept in shared memory and
                 // read where the gradients are formed: a register for it spills instance <2>
    grad_scale_s = grads ? grad_loss * *a.scale : 0.0f;
  __syncthreads();
  const int n = n_shared;
  // From the parameters (a register-free predicate; instance <2> has no register to spare):
  // a launch grad_loss of 0 gives exact zeros without the math. A scale of 0 (a batch without
  // real rows, a device upstream gradient of 0: launched with 1) computes its zeros.
  const bool want_grads = grads && grad_loss != 0.0f;
  const long qi_base = static_cast<long>(t) * HI * kIdxDim;
  if (grads && (n == 0 || !want_grads)) {
    for (int i = tid; i < HI * kIdxDim; i += kThreads) dqi_out[qi_base + i] = __float2bfloat16_rn(0.0f);
    for (int i = tid; i < HI; i += kThreads) dweff[static_cast<long>(t) * HI + i] = 0.0f;
  }
  if (n == 0) {
    if (tid == 0) loss_rows[t] = 0.0f;
    return;
  }
  const bool use_lse = a.sparse && a.lse != nullptr && !drop_shared;
  const int groups = kMaxGroups == 1 && !kGradOnly ? 1 : (H + kHeads - 1) / kHeads;
  // The final pass reads the candidates' masses stored by earlier passes (else it recomputes
  // the teacher): with the forward's LSE, or the sparse loss whenever the heads take several
  // groups (the dense loss has no per-candidate storage).
  const bool store_mass = use_lse || (groups > 1 && a.sparse);
  const bool pred_ops = a.sparse && (a.pred_qi != nullptr || a.pred_keys != nullptr);
  const bf16* pred_qi = pred_ops && a.pred_qi ? a.pred_qi : a.qi;
  const bf16* keys_src = pred_ops && a.pred_keys ? a.pred_keys : a.keys;  // predictor tiles
  // The masses, logits and row sums a forward launch kept (launch_indexer_loss's `kept`):
  // the value launch stores them, the gradient launch reads them and skips every pass before
  // the final one.
  const bool kept = store_mass && kept_buf != nullptr;
  const bool read_kept = kept && grads;
  if constexpr (kGradOnly) {
    if (!read_kept) {  // the caller's contract broken: no teacher here - NaN, never stale values
      for (int i = tid; i < HI * kIdxDim; i += kThreads) dqi_out[qi_base + i] = __float2bfloat16_rn(NAN);
      for (int i = tid; i < HI; i += kThreads) dweff[static_cast<long>(t) * HI + i] = NAN;
      if (tid == 0) loss_rows[t] = NAN;
      return;
    }
  }
  // The value launch after the wgmma teacher (indexer_loss_teacher.cu): a row with the
  // forward's LSE finds its masses in kept_buf and runs only the predictor's pass.
  const bool given = (given_flags & kGivenMasses) && use_lse && kept_buf != nullptr && !grads;
  // ... and its predictor logits too: the indexer's scores of the ids it selected by radix
  // (vis > K; a row with vis <= K took every visible id unscored).
  const bool logits_given = given && (given_flags & kGivenLogits) && vis > d.topk;

  // Row inputs: qI (cp.async, joined by the first tile's wait), w', the forward LSE, and the
  // teacher's Q as A fragments in registers (rows past H zero).
  auto load_qi = [&](const bf16* src) {
    for (int i = tid; i < kIdxHeads * (kIdxRow / 16); i += kThreads) {
      const int r = i / (kIdxRow / 16), c = i % (kIdxRow / 16);
      if (r < HI)
        cp_async_16(smem_addr(qi_s + swz(r, c, kIdxRow)), src + qi_base + r * kIdxDim + c * 8);
      else
        *reinterpret_cast<uint4*>(qi_s + swz(r, c, kIdxRow)) = make_uint4(0u, 0u, 0u, 0u);
    }
    cp_async_commit();
  };
  load_qi(read_kept ? a.qi : pred_qi);  // a kept row's only pass takes the bf16 qI
  for (int h = tid; h < kIdxHeads; h += kThreads) w_s[h] = h < HI ? a.w_eff[static_cast<long>(t) * HI + h] : 0.0f;
  if (!kGradOnly && use_lse && !given)
    for (int h = tid; h < groups * kHeads; h += kThreads)
      lse2_s[h] = h < H ? a.lse[static_cast<long>(t) * H + h] * kLog2e : INFINITY;
  // The teacher's Q of head group `grp` as A fragments in registers (rows past H zero).
  int grp = 0;  // the head group the teacher passes work on (heads 64 grp ..)
  std::uint32_t qf[16][4];
  auto load_qf = [&]() {
    if constexpr (kGradOnly) return;
    const int r0 = kHeads * grp + 16 * wr + g, r1 = r0 + 8;
    const bf16* q0 = a.q + (static_cast<long>(t) * H + r0) * kDim + hh * 256 + 2 * qd;
    const bf16* q1 = q0 + 8L * kDim;
#pragma unroll
    for (int ks = 0; ks < 16; ++ks) {
      qf[ks][0] = r0 < H ? *reinterpret_cast<const std::uint32_t*>(q0 + ks * 16) : 0u;
      qf[ks][1] = r1 < H ? *reinterpret_cast<const std::uint32_t*>(q1 + ks * 16) : 0u;
      qf[ks][2] = r0 < H ? *reinterpret_cast<const std::uint32_t*>(q0 + ks * 16 + 8) : 0u;
      qf[ks][3] = r1 < H ? *reinterpret_cast<const std::uint32_t*>(q1 + ks * 16 + 8) : 0u;
    }
  };
  if (!read_kept && !given) load_qf();

  const int c0 = meta.comp_start[b];
  const QueryWindow win = query_window(d, meta, b, pos);
  const int n_win = win.n;
  const float scale2 = d.scale * kLog2e;
  const KeyGradSink sink_out{dkeys_acc, kIdxDim, a.chunk.scratch, a.chunk.r0, a.chunk.slots};
  const int row0 = 16 * wr + g, row1 = row0 + 8;  // this lane's head rows (teacher and index)

  // Per-lane state across tiles.
  float kl = 0.0f;                       // warp 0: its keys' KL terms
  float im = -INFINITY, il = 0.0f;       // warp 0: predictor (max, sum), natural log
  float tacc = 0.0f;                     // warp 0: sum of the stored teacher masses
  float dw_acc[2] = {0.0f, 0.0f};        // rows row0 / row1, this warp's keys
  float dq[8][4];                        // dqI: heads 16wr.., dims 64hh + 8nt + 2q
#pragma unroll
  for (int j = 0; j < 8; ++j) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.0f;

  // One pass over `count` keys. window: the teacher over the window rows (statistics only);
  // else over the candidates. final: the KL terms and gradients.
  auto pass = [&](bool window, int count, Teach teach, bool pred, bool final_pass) {
    const int tiles = (count + kKeys - 1) / kKeys;
    if constexpr (kGradOnly) teach = Teach::none;
    const bool loads = teach != Teach::none || pred;
    auto load_tile = [&](int tile, int stage) {
      if (teach != Teach::none) {
        unsigned char* base = wide_s + stage * kKeys * kWideRow;
        for (int i = tid; i < kKeys * (kWideRow / 16); i += kThreads) {
          const int r = i / (kWideRow / 16), c = i % (kWideRow / 16);
          const int slot = min(tile * kKeys + r, count - 1);  // past the end: a real row, masked
          const bf16* row = window ? a.kv + static_cast<long>(win.row0 + slot) * kDim
                                   : a.comp + static_cast<long>(c0 + (a.sparse ? cand_s[slot] : slot)) * kDim;
          cp_async_16(smem_addr(base + swz(r, c, kWideRow)), row + c * 8);
        }
      }
      if (pred) {
        unsigned char* base = ik_s + stage * kKeys * kIdxRow;
        for (int i = tid; i < kKeys * (kIdxRow / 16); i += kThreads) {
          const int r = i / (kIdxRow / 16), c = i % (kIdxRow / 16);
          const int slot = min(tile * kKeys + r, count - 1);
          const bf16* row = keys_src + static_cast<long>(c0 + (a.sparse ? cand_s[slot] : slot)) * kIdxDim;
          cp_async_16(smem_addr(base + swz(r, c, kIdxRow)), row + c * 8);
        }
      }
    };
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};  // teacher statistics
    if (loads && tiles > 0) {
      load_tile(0, 0);
      cp_async_commit();
    }
    for (int tile = 0; tile < tiles; ++tile) {
      if (loads) {
        if (tile + 1 < tiles) {
          load_tile(tile + 1, (tile + 1) & 1);
          cp_async_commit();
          cp_async_wait<1>();
        } else {
          cp_async_wait<0>();
        }
      }
      __syncthreads();
      const unsigned char* wt = wide_s + (tile & 1) * kKeys * kWideRow;
      const unsigned char* kt = ik_s + (tile & 1) * kKeys * kIdxRow;
      const int kbase = tile * kKeys + 16 * hh;  // first of this warp's 16 keys

      // The dense loss's final pass past 64 heads: every group's teacher on this tile.
      const int tile_groups = final_pass && teach == Teach::mass ? groups : 1;
      if (teach != Teach::none)
      for (int gi = 0; gi < tile_groups; ++gi) {
        if (tile_groups > 1) {
          grp = gi;
          load_qf();
          if (gi > 0) __syncthreads();  // the partners have read the previous group's xs
        }
        float s[4][4];
        teacher_tile(qf, wt, hh, lane, s);
        // Exchange the dim halves: keep keys 16hh.., send the other 16 to the partner.
        // (Selects, not s[2 * hh + j]: a runtime index would put s in local memory.)
        float* mine = xs + warp * (8 * 32);
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) mine[(j * 4 + i) * 32 + lane] = hh ? s[j][i] : s[2 + j][i];
        __syncthreads();
        const float* theirs = xs + (warp ^ 4) * (8 * 32);
        float z[2][4];
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int key = kbase + 8 * j + 2 * qd + (i & 1);
            const int row = i < 2 ? row0 : row1;
            const float v = ((hh ? s[2 + j][i] : s[j][i]) + theirs[(j * 4 + i) * 32 + lane]) * scale2;
            z[j][i] = key < count && kHeads * grp + row < H ? v : -INFINITY;
          }
        if (teach == Teach::stats) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            float mx = fmaxf(fmaxf(z[0][2 * r], z[0][2 * r + 1]), fmaxf(z[1][2 * r], z[1][2 * r + 1]));
            const float mn = fmaxf(m_run[r], mx);
            if (mn != -INFINITY) {
              l_run[r] = l_run[r] * exp2_ftz(m_run[r] - mn) + exp2_ftz(z[0][2 * r] - mn) +
                         exp2_ftz(z[0][2 * r + 1] - mn) + exp2_ftz(z[1][2 * r] - mn) +
                         exp2_ftz(z[1][2 * r + 1] - mn);
              m_run[r] = mn;
            }
          }
        } else {
          const float l0 = lse2_s[kHeads * grp + row0], l1 = lse2_s[kHeads * grp + row1];
#pragma unroll
          for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) z[j][i] = exp2_ftz(z[j][i] - (i < 2 ? l0 : l1));
          head_sum_to(z, lane, part_t + (4 * gi + wr) * kKeys + 16 * hh);
        }
      }
      float si[2][4];
      if (pred) {
        predictor_tile(qi_s, kt, wr, hh, lane, si);
      }
      if (pred && !(kGradOnly && final_pass)) {  // the logits (kGradOnly's come from `kept`)
        const float wa = w_s[row0], wb = w_s[row1];
        float v[2][4];
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) v[j][i] = (i < 2 ? wa : wb) * fmaxf(si[j][i], 0.0f);
        head_sum_to(v, lane, part_i + wr * kKeys + 16 * hh);
      }
      if (teach == Teach::mass || pred || final_pass) {
        __syncthreads();
        if (warp == 0) {  // one lane per key of the tile
          const int j = tile * kKeys + lane;
          if (j < count) {
            float mass = store_mass ? mass_arr[j] : 0.0f;
            if (teach == Teach::mass) {  // the 4 warp rows' sums, groups in order
              const float* pt = part_t + lane;
              mass = ((pt[0] + pt[kKeys]) + pt[2 * kKeys]) + pt[3 * kKeys];
              for (int gi = 1; gi < tile_groups; ++gi) {
                pt += 4 * kKeys;
                mass += ((pt[0] + pt[kKeys]) + pt[2 * kKeys]) + pt[3 * kKeys];
              }
            }
            // The sparse loss's final pass reads the logits of its first candidate pass.
            const float I = pred && !(a.sparse && final_pass)
                                ? ((part_i[lane] + part_i[kKeys + lane]) + part_i[2 * kKeys + lane]) + part_i[3 * kKeys + lane]
                                : logit_arr[j];
            if (!final_pass) {
              if (pred) {  // the predictor's pass (a later head group's mass pass has none)
                if (a.sparse) logit_arr[j] = I;
                lse_add(im, il, I);
              }
              if (store_mass && teach == Teach::mass) {  // head groups in order
                mass_arr[j] = grp == 0 ? mass : mass_arr[j] + mass;
                tacc += mass;
              }
            } else {
              const float tj = mass / scal[0];
              const float lp = I - scal[1];
              // The sparse predictor is the compact softmax, clamped at FLT_MIN like the CPU's.
              const float logp = a.sparse ? fmaxf(lp, logf(FLT_MIN)) : lp;
              kl += kl_term(tj, logp);
              gk_s[lane] = grad_scale_s * (expf(lp) - tj);
            }
          } else if (final_pass) {
            gk_s[lane] = 0.0f;
          }
        }
      }
      if (final_pass && want_grads) {
        __syncthreads();  // gk_s
        // G^T[key][head] = g_key w'_head 1[S > 0] (bf16) and dw' += g ReLU(S).
        const float wa = w_s[row0], wb = w_s[row1];
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int kt_ = 16 * hh + 8 * j + 2 * qd + (i & 1);  // key within the tile
            const int row = i < 2 ? row0 : row1;
            const float gv = gk_s[kt_];
            dw_acc[i >> 1] += gv * fmaxf(si[j][i], 0.0f);
            const float gg = si[j][i] > 0.0f ? gv * (i < 2 ? wa : wb) : 0.0f;
            *reinterpret_cast<bf16*>(gt_s + swz(kt_, row >> 3, kGRow) + (row & 7) * 2) = __float2bfloat16_rn(gg);
          }
        __syncthreads();  // gt_s
        // dqI[16wr.., 64hh..] += G K^I: A = G from G^T (transposed load), B = K^I (transposed).
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
          std::uint32_t ga[4];
          const int mi = lane >> 3;
          ldmatrix_x4_trans(smem_addr(gt_s + swz(16 * kk + (lane & 7) + ((mi >> 1) << 3),
                                                 2 * wr + (mi & 1), kGRow)), ga);
          const int key = 16 * kk + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
          for (int np = 0; np < 4; ++np) {
            std::uint32_t bv[4];
            ldmatrix_x4_trans(smem_addr(kt + swz(key, (64 * hh + 16 * np) / 8 + (lane >> 4), kIdxRow)), bv);
            mma_bf16(dq[2 * np], ga, bv[0], bv[1]);
            mma_bf16(dq[2 * np + 1], ga, bv[2], bv[3]);
          }
        }
        // dK^I[keys 16(w&1).., dims 32(w>>1)..] = G^T qI over the 64 index heads.
        {
          const int kb = 16 * (warp & 1), db = 32 * (warp >> 1);
          float dk[4][4];
#pragma unroll
          for (int j = 0; j < 4; ++j) dk[j][0] = dk[j][1] = dk[j][2] = dk[j][3] = 0.0f;
#pragma unroll
          for (int ks = 0; ks < kIdxHeads / 16; ++ks) {
            std::uint32_t ga[4];
            ldmatrix_x4(smem_addr(gt_s + swz(kb + (lane & 15), 2 * ks + (lane >> 4), kGRow)), ga);
            const int head = 16 * ks + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
            for (int np = 0; np < 2; ++np) {
              std::uint32_t bv[4];
              ldmatrix_x4_trans(smem_addr(qi_s + swz(head, (db + 16 * np) / 8 + (lane >> 4), kIdxRow)), bv);
              mma_bf16(dk[2 * np], ga, bv[0], bv[1]);
              mma_bf16(dk[2 * np + 1], ga, bv[2], bv[3]);
            }
          }
          if (sink_out.scratch == nullptr) {
            // This warp's xs slot is free here: its partner read it before the syncs above,
            // and the next write is this warp's own, in the next tile.
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const int slot = tile * kKeys + kb + g + 8 * r;
              const int key_row = slot < count ? c0 + (a.sparse ? cand_s[slot] : slot) : -1;
              const float2 v[4] = {make_float2(dk[0][2 * r], dk[0][2 * r + 1]), make_float2(dk[1][2 * r], dk[1][2 * r + 1]),
                                   make_float2(dk[2][2 * r], dk[2][2 * r + 1]), make_float2(dk[3][2 * r], dk[3][2 * r + 1])};
              add_key_grads_lines(sink_out, key_row, db, v, xs + warp * kLineStageFloats);
            }
          } else {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const int slot = tile * kKeys + kb + g + 8 * r;
              if (slot < count)
#pragma unroll
                for (int nt = 0; nt < 4; ++nt)
                  store_key_grad(sink_out, t, slot, db + 8 * nt + 2 * qd, dk[nt][2 * r], dk[nt][2 * r + 1]);
            }
          }
        }
      }
      __syncthreads();  // the stage, xs, part_*, gk_s and gt_s are rewritten next
    }
    if (teach == Teach::stats) {  // merge the lanes of a row, then the two key halves
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int o = 1; o <= 2; o <<= 1)
          merge_stats(m_run[r], l_run[r], __shfl_xor_sync(0xffffffffu, m_run[r], o),
                      __shfl_xor_sync(0xffffffffu, l_run[r], o));
      if (qd == 0) {
        stats_s[(hh * kHeads + row0) * 2] = m_run[0];
        stats_s[(hh * kHeads + row0) * 2 + 1] = l_run[0];
        stats_s[(hh * kHeads + row1) * 2] = m_run[1];
        stats_s[(hh * kHeads + row1) * 2 + 1] = l_run[1];
      }
      __syncthreads();
      if (tid < kHeads) {
        float m = stats_s[tid * 2], l = stats_s[tid * 2 + 1];
        merge_stats(m, l, stats_s[(kHeads + tid) * 2], stats_s[(kHeads + tid) * 2 + 1]);
        float* dst = src_stats + ((window ? 0 : 1) * kHeads + tid) * 2;
        dst[0] = m;
        dst[1] = l;
      }
      __syncthreads();
    }
  };

  // The row's kept (mass, logit) pairs into mass_arr / logit_arr.
  auto load_kept_pairs = [&]() {
    const float* kc = kept_buf + static_cast<long>(t) * d.topk * 2;
    for (int j = tid; j < n; j += kThreads) {
      const float2 v = *reinterpret_cast<const float2*>(kc + 2 * j);
      mass_arr[j] = v.x;
      logit_arr[j] = v.y;
    }
  };
  if (read_kept) {
    load_kept_pairs();
    if (tid == 0) {
      scal[0] = kept_buf[(static_cast<long>(d.rows) * d.topk + t) * 2];
      scal[1] = kept_buf[(static_cast<long>(d.rows) * d.topk + t) * 2 + 1];
    }
    cp_async_wait<0>();  // qI (the final pass's first wait joins it only when it loads keys)
  } else if (logits_given) {
    load_kept_pairs();
    __syncthreads();
    cp_async_wait<0>();  // qI, loaded at the start and not read by this launch
    // The predictor's LSE as its pass forms it: key j on lane j % 32, in order.
    if (warp == 0)
      for (int j = lane; j < n; j += 32) {
        lse_add(im, il, logit_arr[j]);
        tacc += mass_arr[j];
      }
  } else if (given) {
    const float* kc = kept_buf + static_cast<long>(t) * d.topk * 2;
    for (int j = tid; j < n; j += kThreads) mass_arr[j] = kc[2 * j];
    __syncthreads();
    pass(false, n, Teach::none, true, false);  // the predictor's logits and LSE
    // The masses' sum, key j on lane j % 32 as the teacher pass adds them (with two head
    // groups that pass adds group 0's masses, then group 1's; here each key's total: the same
    // sum in another order - the value launch and the backward both read what this stores).
    if (warp == 0)
      for (int j = lane; j < n; j += 32) tacc += mass_arr[j];
  } else if (use_lse) {
    for (grp = 0; grp < groups; ++grp) {  // the predictor with the first group
      if (grp > 0) load_qf();
      pass(false, n, Teach::mass, grp == 0, false);
    }
  } else {
    for (grp = 0; grp < groups; ++grp) {
      if (grp > 0) load_qf();
      pass(true, n_win, Teach::stats, false, false);
      pass(false, n, Teach::stats, grp == 0, false);
      // Full per-head LSE (sink + window + candidates) and each head's candidate share.
      if (tid < kHeads) {
        const int h = kHeads * grp + tid;
        float lse2 = INFINITY, share = 0.0f;
        if (h < H) {
          float m = a.sink[h] * kLog2e, l = 1.0f;
          merge_stats(m, l, src_stats[tid * 2], src_stats[tid * 2 + 1]);
          const float mc = src_stats[(kHeads + tid) * 2], lc = src_stats[(kHeads + tid) * 2 + 1];
          merge_stats(m, l, mc, lc);
          lse2 = m + log2f(l);
          share = lc > 0.0f ? lc * exp2f(mc - lse2) : 0.0f;
        }
        lse2_s[h] = lse2;
        ratio_s[h] = share;
      }
      __syncthreads();
    }
    if (store_mass)  // the sparse loss past 64 heads: the masses, group by group, stored
      for (grp = 0; grp < groups; ++grp) {
        load_qf();
        pass(false, n, Teach::mass, false, false);
      }
  }
  if (warp == 0 && !read_kept) {  // the teacher's L1 denominator and the predictor's LSE (fixed order)
    float tsum = 0.0f;
    if (store_mass) {
      tsum = warp_sum(tacc);
    } else {
      for (int h = 0; h < groups * kHeads; ++h) tsum += ratio_s[h];
    }
    merge_lse_lanes(im, il);
    if (lane == 0) {
      scal[0] = fmaxf(tsum, FLT_MIN);
      scal[1] = im + logf(il);
    }
  }
  __syncthreads();
  if (kept && !grads) {  // kept for the gradient launch (the same order as read above)
    float* kc = kept_buf + static_cast<long>(t) * d.topk * 2;
    for (int j = tid; j < n; j += kThreads)
      *reinterpret_cast<float2*>(kc + 2 * j) = make_float2(mass_arr[j], logit_arr[j]);
    if (tid == 0) {
      kept_buf[(static_cast<long>(d.rows) * d.topk + t) * 2] = scal[0];
      kept_buf[(static_cast<long>(d.rows) * d.topk + t) * 2 + 1] = scal[1];
    }
  }
  if (pred_ops && want_grads) {  // the final pass's S (gradients) from the bf16 operands
    keys_src = a.keys;
    if (!read_kept) {  // (a kept row loaded the bf16 qI at the start)
      load_qi(a.qi);
      cp_async_wait<0>();
      __syncthreads();
    }
  }
  // The final pass's S: the dense loss's values and gradients, the sparse loss's gradients
  // (its teacher, where it recomputes one, is the single group's: group 0).
  grp = 0;
  pass(false, n, store_mass ? Teach::none : Teach::mass, a.sparse ? want_grads : true, true);

  if (warp == 0) {
    kl = warp_sum(kl);
    if (lane == 0) loss_rows[t] = kl;
  }
  if (!want_grads) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    dw_acc[r] += __shfl_xor_sync(0xffffffffu, dw_acc[r], 1);
    dw_acc[r] += __shfl_xor_sync(0xffffffffu, dw_acc[r], 2);
  }
  if (qd == 0) {
    dwp[hh * kIdxHeads + row0] = dw_acc[0];
    dwp[hh * kIdxHeads + row1] = dw_acc[1];
  }
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    const int dim = 64 * hh + 8 * nt + 2 * qd;
    if (row0 < HI)
      *reinterpret_cast<__nv_bfloat162*>(dqi_out + qi_base + row0 * kIdxDim + dim) =
          __floats2bfloat162_rn(dq[nt][0], dq[nt][1]);
    if (row1 < HI)
      *reinterpret_cast<__nv_bfloat162*>(dqi_out + qi_base + row1 * kIdxDim + dim) =
          __floats2bfloat162_rn(dq[nt][2], dq[nt][3]);
  }
  __syncthreads();
  if (tid < HI) dweff[static_cast<long>(t) * HI + tid] = dwp[tid] + dwp[kIdxHeads + tid];
}

// The instance for d's heads: one head group up to 64 heads, two past.
auto loss_kernel(const LayerDims& d) {
  return d.heads > kHeads ? indexer_loss_mma_kernel<kGroups> : indexer_loss_mma_kernel<1>;
}

}  // namespace

bool indexer_loss_mma_supported(const LayerDims& d) {
  return d.head_dim == kDim && d.heads <= kGroups * kHeads && d.index_dim == kIdxDim &&
         d.index_heads <= kIdxHeads && mma_smem_bytes(d, true) <= dynamic_smem_limit(loss_kernel(d));
}

void launch_indexer_loss_rows_mma(const LayerDims& d, const DeviceMetadata& meta,
                                  const IndexerLossArgs& a, float* loss_rows, bool grads,
                                  float grad_loss, bf16* dqi, float* dweff, float* dkeys_acc,
                                  float* kept, int given, cudaStream_t stream) {
  require(indexer_loss_mma_supported(d), ErrorKind::Unsupported,
          "the tensor-core indexer loss needs head_dim 512, index_head_dim 128, at most 64 index "
          "heads and 128 heads");
  // The gradient launch whose rows all read their kept values (the caller's contract,
  // kKeptGradients): the gradient-only instance, two CTAs an SM.
  const bool grad_only = (given & kKeptGradients) != 0;
  require(!grad_only || (grads && a.sparse && kept != nullptr), ErrorKind::Internal,
          "kKeptGradients is for the sparse loss's gradient launch with kept values");
  const std::size_t smem = mma_smem_bytes(d, a.sparse, grad_only);
  auto kernel = grad_only ? indexer_loss_mma_kernel<1, true> : loss_kernel(d);
  allow_dynamic_smem(kernel, smem, "the tensor-core indexer loss");
  const int rows = a.chunk.launch_rows(d.rows);
  if (rows <= 0) return;
  kernel<<<rows, kThreads, smem, stream>>>(d, meta, a, loss_rows, grads, grad_loss, dqi, dweff,
                                           dkeys_acc, kept, given);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
