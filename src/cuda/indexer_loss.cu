// The indexer KL loss on the GPU: the CUDA-core reference kernel (one block per query row),
// the launcher that picks it or the tensor-core kernel (indexer_loss_mma.cu), the loss sum.
//   predictor p = softmax over the candidates S_t of I[t, j] = sum_h w'_h ReLU(qI_h . K_j),
//   teacher  T(j) = sum_h exp(z_h(j) - LSE_h) normalised over S_t, where LSE_h is the full
//            CSA denominator (sink + window + candidates) of the detached main attention,
//   KL_t     = sum_j T (log max(T, 1e-10) - log p).
// With grads, the exact softmax-KL gradient g_j = scale (p_j - T_j) flows into w', qI and
// K (K through atomics; qI per row; w' per row, summed in a fixed order across warps).
// The sparse loss with predictor operands (a.pred_qi / a.pred_keys, the MXFP8 indexer's):
// I, hence p, from those; the gradient's ReLU masks and products from qI / K.
#include <cfloat>
#include <cmath>
#include <string>

#include "cuda/backward_kernels.hpp"
#include "cuda/check.hpp"
#include "cuda/device_util.cuh"
#include "cuda/kernel_switch.hpp"

namespace csattn::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxHeadsPerLane = 4;   // H and H_I up to 128
constexpr int kMaxDimPerLane = 16;    // D up to 512 in registers
constexpr int kMaxIdxDimPerLane = 8;  // D_I up to 256

struct LossSmem {
  int* cand;        // [cap] segment-local candidate ids
  float* logits;    // [cap] I
  float* target;    // [cap] T
  bf16* qi;         // [H_I * D_I]
  float* dqi;       // [H_I * D_I]
  float* stats;     // [kWarps, H, 2] per-warp (max, sum) of the teacher
  float* lse;       // [H]
  float* dw;        // [kWarps, H_I]
};

__global__ void __launch_bounds__(kThreads)
    indexer_loss_kernel(LayerDims d, DeviceMetadata meta, IndexerLossArgs a, int cap,
                        float* loss_rows, bool grads, float grad_loss, bf16* dqi_out,
                        float* dweff, float* dkeys_acc) {
  const float grad_scale = grads ? grad_loss * *a.scale : 0.0f;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int H = d.heads, D = d.head_dim, HI = d.index_heads, DI = d.index_dim;
  LossSmem s;
  s.qi = reinterpret_cast<bf16*>(smem_raw);
  s.dqi = reinterpret_cast<float*>(s.qi + HI * DI);
  s.stats = s.dqi + HI * DI;
  s.lse = s.stats + kWarps * H * 2;
  s.dw = s.lse + H;
  s.logits = s.dw + kWarps * HI;
  s.target = s.logits + cap;
  s.cand = reinterpret_cast<int*>(s.target + cap);
  __shared__ float scratch[32];
  __shared__ int count;

  const int t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int b = meta.row_segment[t], pos = meta.row_position[t];
  const int vis = meta.row_is_padding[t]
                      ? 0
                      : min((pos + 1) / d.ratio, meta.comp_start[b + 1] - meta.comp_start[b]);
  if (threadIdx.x == 0) {
    int c = 0;
    if (a.sparse) {
      const std::int32_t* sel = a.topk + static_cast<long>(t) * d.topk;
      for (int k = 0; k < d.topk; ++k)
        if (sel[k] >= 0 && sel[k] < vis) s.cand[c++] = sel[k];
    } else {
      c = vis;
    }
    count = c;
  }
  __syncthreads();
  const int nc = count;
  if (!a.sparse)
    for (int j = threadIdx.x; j < nc; j += kThreads) s.cand[j] = j;
  if (nc == 0) {
    if (threadIdx.x == 0) loss_rows[t] = 0.0f;
    if (grads) {
      for (int i = threadIdx.x; i < HI * DI; i += kThreads) dqi_out[static_cast<long>(t) * HI * DI + i] = __float2bfloat16_rn(0.0f);
      for (int i = threadIdx.x; i < HI; i += kThreads) dweff[static_cast<long>(t) * HI + i] = 0.0f;
    }
    return;
  }
  const long qi_base = static_cast<long>(t) * HI * DI;
  const bool pred_ops = a.sparse && (a.pred_qi != nullptr || a.pred_keys != nullptr);
  const bf16* pred_qi = pred_ops && a.pred_qi ? a.pred_qi : a.qi;
  for (int i = threadIdx.x; i < HI * DI; i += kThreads) {
    s.qi[i] = pred_qi[qi_base + i];
    s.dqi[i] = 0.0f;
  }
  __syncthreads();
  const float* w = a.w_eff + static_cast<long>(t) * HI;
  const bf16* seg_keys = a.keys + static_cast<long>(meta.comp_start[b]) * DI;
  const bf16* seg_pred_keys = (pred_ops && a.pred_keys ? a.pred_keys : a.keys) +
                              static_cast<long>(meta.comp_start[b]) * DI;
  const bf16* seg_comp = a.comp + static_cast<long>(meta.comp_start[b]) * D;

  // Predictor logits (from the predictor operands).
  for (int j = warp; j < nc; j += kWarps) {
    const bf16* key = seg_pred_keys + static_cast<long>(s.cand[j]) * DI;
    float kr[kMaxIdxDimPerLane];
#pragma unroll
    for (int r = 0; r < kMaxIdxDimPerLane; ++r) {
      const int i = lane + 32 * r;
      kr[r] = i < DI ? __bfloat162float(key[i]) : 0.0f;
    }
    float acc = 0.0f;
    for (int h = 0; h < HI; ++h) {
      float part = 0.0f;
#pragma unroll
      for (int r = 0; r < kMaxIdxDimPerLane; ++r) {
        const int i = lane + 32 * r;
        if (i < DI) part += __bfloat162float(s.qi[h * DI + i]) * kr[r];
      }
      acc += w[h] * fmaxf(warp_sum(part), 0.0f);
    }
    if (lane == 0) s.logits[j] = acc;
  }

  // Teacher statistics over sink + window + candidates; lane (h mod 32) keeps head h's
  // running (max, sum) for this warp's keys.
  const QueryWindow win = query_window(d, meta, b, pos);
  const int n_win = win.n;
  float run_m[kMaxHeadsPerLane], run_s[kMaxHeadsPerLane];
#pragma unroll
  for (int r = 0; r < kMaxHeadsPerLane; ++r) { run_m[r] = -INFINITY; run_s[r] = 0.0f; }
  const bf16* qrow = a.q + static_cast<long>(t) * H * D;
  for (int k = warp; k < n_win + nc; k += kWarps) {
    const bf16* v = k < n_win ? a.kv + static_cast<long>(win.row0 + k) * D
                              : seg_comp + static_cast<long>(s.cand[k - n_win]) * D;
    float vr[kMaxDimPerLane];
#pragma unroll
    for (int r = 0; r < kMaxDimPerLane; ++r) {
      const int i = lane + 32 * r;
      vr[r] = i < D ? __bfloat162float(v[i]) : 0.0f;
    }
    for (int h = 0; h < H; ++h) {
      float part = 0.0f;
#pragma unroll
      for (int r = 0; r < kMaxDimPerLane; ++r) {
        const int i = lane + 32 * r;
        if (i < D) part += __bfloat162float(qrow[h * D + i]) * vr[r];
      }
      const float z = warp_sum(part) * d.scale;
      if ((h & 31) == lane) {
        const int r = h >> 5;
#pragma unroll
        for (int rr = 0; rr < kMaxHeadsPerLane; ++rr)
          if (rr == r) {
            const float m_new = fmaxf(run_m[rr], z);
            run_s[rr] = run_s[rr] * expf(run_m[rr] - m_new) + expf(z - m_new);
            run_m[rr] = m_new;
          }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kMaxHeadsPerLane; ++rr) {
    const int h = lane + 32 * rr;
    if (h < H) {
      s.stats[(warp * H + h) * 2] = run_m[rr];
      s.stats[(warp * H + h) * 2 + 1] = run_s[rr];
    }
  }
  __syncthreads();
  for (int h = threadIdx.x; h < H; h += kThreads) {
    float m = a.sink[h];
    for (int wi = 0; wi < kWarps; ++wi) m = fmaxf(m, s.stats[(wi * H + h) * 2]);
    float z = expf(a.sink[h] - m);
    for (int wi = 0; wi < kWarps; ++wi) {
      const float mw = s.stats[(wi * H + h) * 2];
      if (mw > -INFINITY) z += s.stats[(wi * H + h) * 2 + 1] * expf(mw - m);
    }
    s.lse[h] = m + logf(z);
  }
  __syncthreads();

  // Teacher mass per candidate, summed over heads.
  for (int j = warp; j < nc; j += kWarps) {
    const bf16* v = seg_comp + static_cast<long>(s.cand[j]) * D;
    float vr[kMaxDimPerLane];
#pragma unroll
    for (int r = 0; r < kMaxDimPerLane; ++r) {
      const int i = lane + 32 * r;
      vr[r] = i < D ? __bfloat162float(v[i]) : 0.0f;
    }
    float mass = 0.0f;
    for (int h = 0; h < H; ++h) {
      float part = 0.0f;
#pragma unroll
      for (int r = 0; r < kMaxDimPerLane; ++r) {
        const int i = lane + 32 * r;
        if (i < D) part += __bfloat162float(qrow[h * D + i]) * vr[r];
      }
      mass += expf(warp_sum(part) * d.scale - s.lse[h]);
    }
    if (lane == 0) s.target[j] = mass;
  }
  __syncthreads();

  // Normalise, predictor softmax, KL.
  float tsum = 0.0f, imax = -INFINITY;
  for (int j = threadIdx.x; j < nc; j += kThreads) {
    tsum += s.target[j];
    imax = fmaxf(imax, s.logits[j]);
  }
  tsum = fmaxf(block_sum(tsum, scratch), FLT_MIN);
  imax = block_max(imax, scratch);
  float isum = 0.0f;
  for (int j = threadIdx.x; j < nc; j += kThreads) isum += expf(s.logits[j] - imax);
  isum = block_sum(isum, scratch);
  const float ilse = imax + logf(isum);
  float kl = 0.0f;
  for (int j = threadIdx.x; j < nc; j += kThreads) {
    const float tj = s.target[j] / tsum;
    s.target[j] = tj;
    // The sparse predictor is the compact softmax, clamped at FLT_MIN like the CPU's.
    const float logp = a.sparse ? fmaxf(s.logits[j] - ilse, logf(FLT_MIN)) : s.logits[j] - ilse;
    kl += tj * (logf(fmaxf(tj, 1e-10f)) - logp);
  }
  kl = block_sum(kl, scratch);
  if (threadIdx.x == 0) loss_rows[t] = kl;
  if (!grads) return;
  if (pred_ops) {  // the gradients go through the bf16 scores
    __syncthreads();
    for (int i = threadIdx.x; i < HI * DI; i += kThreads) s.qi[i] = a.qi[qi_base + i];
  }
  __syncthreads();

  // Gradients: g_j = grad_scale (p_j - T_j) through the ReLU-weighted head sum.
  float dw_lane[kMaxHeadsPerLane];
#pragma unroll
  for (int r = 0; r < kMaxHeadsPerLane; ++r) dw_lane[r] = 0.0f;
  for (int j = warp; j < nc; j += kWarps) {
    const float g = grad_scale * (expf(s.logits[j] - ilse) - s.target[j]);
    const bf16* key = seg_keys + static_cast<long>(s.cand[j]) * DI;
    float kr[kMaxIdxDimPerLane], dk[kMaxIdxDimPerLane];
#pragma unroll
    for (int r = 0; r < kMaxIdxDimPerLane; ++r) {
      const int i = lane + 32 * r;
      kr[r] = i < DI ? __bfloat162float(key[i]) : 0.0f;
      dk[r] = 0.0f;
    }
    for (int h = 0; h < HI; ++h) {
      float part = 0.0f;
#pragma unroll
      for (int r = 0; r < kMaxIdxDimPerLane; ++r) {
        const int i = lane + 32 * r;
        if (i < DI) part += __bfloat162float(s.qi[h * DI + i]) * kr[r];
      }
      const float dot = warp_sum(part);
      if ((h & 31) == lane) {
#pragma unroll
        for (int rr = 0; rr < kMaxHeadsPerLane; ++rr)
          if (rr == (h >> 5)) dw_lane[rr] += g * fmaxf(dot, 0.0f);
      }
      if (dot > 0.0f) {
        const float coef = g * w[h];
#pragma unroll
        for (int r = 0; r < kMaxIdxDimPerLane; ++r) {
          const int i = lane + 32 * r;
          if (i < DI) {
            dk[r] += coef * __bfloat162float(s.qi[h * DI + i]);
            atomicAdd(&s.dqi[h * DI + i], coef * kr[r]);
          }
        }
      }
    }
    float* dst = dkeys_acc + static_cast<long>(meta.comp_start[b] + s.cand[j]) * DI;
#pragma unroll
    for (int r = 0; r < kMaxIdxDimPerLane; ++r) {
      const int i = lane + 32 * r;
      if (i < DI) atomicAdd(dst + i, dk[r]);
    }
  }
#pragma unroll
  for (int rr = 0; rr < kMaxHeadsPerLane; ++rr) {
    const int h = lane + 32 * rr;
    if (h < HI) s.dw[warp * HI + h] = dw_lane[rr];
  }
  __syncthreads();
  for (int h = threadIdx.x; h < HI; h += kThreads) {
    float acc = 0.0f;
    for (int wi = 0; wi < kWarps; ++wi) acc += s.dw[wi * HI + h];
    dweff[static_cast<long>(t) * HI + h] = acc;
  }
  for (int i = threadIdx.x; i < HI * DI; i += kThreads) dqi_out[qi_base + i] = __float2bfloat16_rn(s.dqi[i]);
}

__global__ void loss_reduce_kernel(const float* rows, int n, const float* scale, float* loss) {
  __shared__ float scratch[32];
  // Each thread sums a contiguous chunk, then a fixed-order block sum: deterministic.
  const int chunk = (n + blockDim.x - 1) / blockDim.x;
  const int lo = min(n, static_cast<int>(threadIdx.x) * chunk), hi = min(n, lo + chunk);
  float acc = 0.0f;
  for (int i = lo; i < hi; ++i) acc += rows[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) loss[0] = acc * *scale;
}

__global__ void product_kernel(const float* a, const float* b, float* out) {
  if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = a[0] * b[0];
}

__global__ void indexer_weights_backward_kernel(int n, float scale, const float* dweff, bf16* dwraw) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dwraw[i] = __float2bfloat16_rn(dweff[i] * scale);
}

}  // namespace

void launch_indexer_loss(const LayerDims& d, const DeviceMetadata& meta, const IndexerLossArgs& a,
                         float* loss_rows, float* loss, bool grads, float grad_loss, bf16* dqi,
                         float* dweff, float* dkeys_acc, float* kept, cudaStream_t stream,
                         IndexerLossKernel kernel, bool logits_kept, bool own_selection) {
  require(a.scale != nullptr, ErrorKind::InvalidArgument,
          "the indexer loss needs its scale on the device (IndexerLossArgs::scale: "
          "DeviceMetadata::loss_scale)");
  if (d.rows <= 0) {  // no rows: the loss is 0 (never a stale value)
    if (!grads && loss) CSATTN_CUDA_CHECK(cudaMemsetAsync(loss, 0, sizeof(float), stream));
    return;
  }
  // CSATTN_INDEXER_LOSS=baseline asks for the CUDA-core kernel (benchmarks, bisecting).
  static const bool force_baseline = kernel_switch("CSATTN_INDEXER_LOSS", {"baseline"}) == "baseline";
  const bool mma = kernel == IndexerLossKernel::tensor_core ||
                   (kernel == IndexerLossKernel::automatic && !force_baseline &&
                    indexer_loss_mma_supported(d));
  if (mma) {
    // The sparse value launch that keeps its teacher: the masses from the wgmma teacher, the
    // rest from the rows kernel (its own mma.sync teacher took 1.24-1.41x the value launch's
    // time, H200 2026-12-06: perf.md). A whole launch only: the teacher serves every row at once.
    const bool teacher = kernel == IndexerLossKernel::automatic && !grads &&
                         a.sparse && a.lse != nullptr && kept != nullptr && a.chunk.r0 == 0 &&
                         a.chunk.rows < 0 && indexer_teacher_wgmma_supported(d);
    if (teacher) launch_indexer_teacher_wgmma(d, meta, a, kept, stream, logits_kept);
    // Rows with given masses and logits take their KL from `kept` alone (kGivenLight).
    int given = teacher ? kGivenMasses | (logits_kept ? kGivenLogits | kGivenLight : 0) : 0;
    if (grads && own_selection && a.sparse && a.lse != nullptr && kept != nullptr) given |= kKeptGradients;
    launch_indexer_loss_rows_mma(d, meta, a, loss_rows, grads, grad_loss, dqi, dweff, dkeys_acc,
                                 kept, given, stream);
  } else {
    require(a.chunk.scratch == nullptr && a.chunk.r0 == 0 && a.chunk.rows < 0, ErrorKind::Unsupported,
            "deterministic backward: the indexer loss needs its tensor-core kernel (head_dim 512, "
            "index_head_dim 128, at most 64 index heads and 128 heads); the CUDA-core kernel "
            "sums key gradients with atomics");
    require(d.heads <= 32 * kMaxHeadsPerLane && d.index_heads <= 32 * kMaxHeadsPerLane &&
                d.head_dim <= 32 * kMaxDimPerLane && d.index_dim <= 32 * kMaxIdxDimPerLane,
            ErrorKind::Unsupported,
            "the CUDA indexer loss supports up to 128 heads, head_dim 512 and index_head_dim 256");
    const int cap = a.sparse ? d.topk : d.max_seg_len / d.ratio;
    const std::size_t smem = static_cast<std::size_t>(d.index_heads) * d.index_dim * (2 + 4) +
                             sizeof(float) * (static_cast<std::size_t>(kWarps) * d.heads * 2 + d.heads +
                                              static_cast<std::size_t>(kWarps) * d.index_heads + 2 * cap) +
                             sizeof(int) * cap + 16;
    require(smem <= 220 * 1024, ErrorKind::Unsupported,
            "the CUDA-core indexer loss keeps one row's candidates in shared memory: " +
                std::to_string(cap) + " candidates need " + std::to_string(smem) +
                " bytes, more than 220 KiB (the tensor-core kernel has no such cap)");
    allow_dynamic_smem(indexer_loss_kernel, smem, "the CUDA indexer loss");
    indexer_loss_kernel<<<d.rows, kThreads, smem, stream>>>(d, meta, a, cap, loss_rows, grads,
                                                            grad_loss, dqi, dweff, dkeys_acc);
    CSATTN_CUDA_LAUNCH_CHECK();
  }
  if (!grads) {
    loss_reduce_kernel<<<1, 1024, 0, stream>>>(loss_rows, d.rows, a.scale, loss);
    CSATTN_CUDA_LAUNCH_CHECK();
  }
}

void launch_loss_gradient_scale(const float* grad_loss, const float* scale, float* out,
                                cudaStream_t stream) {
  product_kernel<<<1, 32, 0, stream>>>(grad_loss, scale, out);
  CSATTN_CUDA_LAUNCH_CHECK();
}

void launch_indexer_weights_backward(const LayerDims& d, const float* dweff, bf16* dwraw,
                                     cudaStream_t stream) {
  const int n = d.rows * d.index_heads;
  if (n <= 0) return;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.index_heads)) /
                                         std::sqrt(static_cast<double>(d.index_dim)));
  indexer_weights_backward_kernel<<<(n + 255) / 256, 256, 0, stream>>>(n, scale, dweff, dwraw);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
