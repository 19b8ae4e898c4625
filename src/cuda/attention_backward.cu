// Sparse attention backward, baseline (CUDA cores), and the dispatch to the tensor-core kernels
// for head_dim 512 (attention_backward_wgmma.cu, attention_backward_mma.cu). The baseline: one block per query row, two
// passes over its keys, each recomputing P from the saved LSE and dz = P (dO.v - D_row):
//   1. key gradients: per tile of 32 keys, the heads in turn, dK_k += sum_h (P dO_h + tau dz q_h)
//      (K = V, so the key and value terms land on the same row). The head sum happens in
//      registers, so each (row, key, dim) costs one atomic add into the fp32 key gradients
//      (or, deterministic mode, one store into the chunk's scratch; see grad_chunk.hpp);
//   2. dQ: per head, the tiles in turn, dq_h = tau sum_k dz K_k in registers, stored once in
//      bf16 - so dQ needs no fp32 buffer in global memory (the tensor-core kernels hold a
//      head block's whole sum too), at the price of computing P and dz twice.
// d_sink = -P_sink * D_row per (row, head), summed later in a fixed order.
#include <cmath>
#include <string>

#include "cuda/attention_keys.cuh"
#include "cuda/backward_kernels.hpp"
#include "cuda/check.hpp"
#include "cuda/device_util.cuh"
#include "cuda/kernel_switch.hpp"

namespace csattn::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 32;
constexpr int kMaxDimPerThread = 4;  // head_dim <= 1024

__global__ void __launch_bounds__(kThreads)
    attention_backward_kernel(LayerDims d, DeviceMetadata meta, const bf16* q, const bf16* kv,
                              const bf16* comp, const float* sink, const std::int32_t* topk,
                              OutputRows out, const float* lse, const bf16* dout, bf16* dq,
                              float* dkv_acc, float* dcomp_acc, float* dsink_part,
                              GradChunk chunk) {
  extern __shared__ float sm[];
  const int D = d.head_dim, H = d.heads;
  float* ktile = sm;                      // [kTile, D]
  float* qh = ktile + kTile * D;          // [D]
  float* gh = qh + D;                     // [D] dO of the head
  float* drow = gh + D;                   // [H]
  float* p = drow + H;                    // [kTile]
  float* dz = p + kTile;                  // [kTile]
  int* ids = reinterpret_cast<int*>(dz + kTile);  // [max_keys]
  __shared__ int count;
  const int t = chunk.r0 + static_cast<int>(blockIdx.x);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n = build_key_list(d, meta, topk, t, ids, &count);
  // Pass 1's keys: all, or (GradChunk::window_only: the compressed rows' gradients are
  // summed key-stationary, launch_comp_grad_keyed) the window's.
  const int n_dk = chunk.scratch && chunk.window_only
                       ? query_window(d, meta, meta.row_segment[t], meta.row_position[t]).n
                       : n;

  // D_row = dO . o per head, and the sink gradient.
  for (int h = warp; h < H; h += kWarps) {
    const long row = static_cast<long>(t) * H + h, base = row * D;
    float acc = 0.0f;
    for (int i = lane; i < D; i += 32)
      acc += __bfloat162float(dout[base + i]) * __bfloat162float(*out.at(row, i, D));
    acc = warp_sum(acc);
    if (lane == 0) {
      drow[h] = acc;
      const float l = lse[static_cast<long>(t) * H + h];
      dsink_part[static_cast<long>(t) * H + h] = -expf(sink[h] - l) * acc;
    }
  }
  __syncthreads();

  // Both passes: the keys tile0 .. tile0 + nk - 1 into ktile (zero past nk), and head h's
  // q and dO rows into qh / gh; then p[k] and dz[k] of head h over the tile (0 past nk).
  // Each starts after a barrier that ends the previous readers of what it overwrites.
  auto load_tile = [&](int tile0, int nk) {
    for (int i = threadIdx.x; i < kTile * D; i += kThreads) {
      const int k = i / D, c = i % D;
      ktile[i] = k < nk ? __bfloat162float(key_row_ptr(ids[tile0 + k], kv, comp, D)[c]) : 0.0f;
    }
  };
  auto load_head = [&](int h) {
    const long base = (static_cast<long>(t) * H + h) * D;
    for (int i = threadIdx.x; i < D; i += kThreads) {
      qh[i] = __bfloat162float(q[base + i]);
      gh[i] = __bfloat162float(dout[base + i]);
    }
  };
  auto probabilities = [&](int h, int nk) {
    const float l = lse[static_cast<long>(t) * H + h];
    for (int k = warp; k < kTile; k += kWarps) {
      float s = 0.0f, dp = 0.0f;
      for (int i = lane; i < D; i += 32) {
        s += qh[i] * ktile[k * D + i];
        dp += gh[i] * ktile[k * D + i];
      }
      s = warp_sum(s);
      dp = warp_sum(dp);
      if (lane == 0) {
        const float pk = k < nk ? expf(s * d.scale - l) : 0.0f;
        p[k] = pk;
        dz[k] = pk * (dp - drow[h]);
      }
    }
  };

  // Pass 1: the key gradients, summed over the heads in registers per tile.
  for (int tile0 = 0; tile0 < n_dk; tile0 += kTile) {
    const int nk = min(kTile, n_dk - tile0);
    load_tile(tile0, nk);
    float acc[kTile][kMaxDimPerThread];
#pragma unroll
    for (int k = 0; k < kTile; ++k)
#pragma unroll
      for (int r = 0; r < kMaxDimPerThread; ++r) acc[k][r] = 0.0f;

    for (int h = 0; h < H; ++h) {
      __syncthreads();  // ktile ready / previous head's qh, gh, p, dz consumed
      load_head(h);
      __syncthreads();
      probabilities(h, nk);
      __syncthreads();
#pragma unroll
      for (int r = 0; r < kMaxDimPerThread; ++r) {
        const int i = threadIdx.x + r * kThreads;
        if (i >= D) continue;
        const float gi = gh[i], qi = qh[i] * d.scale;
#pragma unroll
        for (int k = 0; k < kTile; ++k) acc[k][r] += p[k] * gi + dz[k] * qi;
      }
    }
    // One atomic per (key, dim): the head sum is done.
#pragma unroll
    for (int r = 0; r < kMaxDimPerThread; ++r) {
      const int i = threadIdx.x + r * kThreads;
      if (i >= D) continue;
#pragma unroll
      for (int k = 0; k < kTile; ++k) {  // constant indices keep acc in registers
        if (k >= nk) break;
        const int id = ids[tile0 + k];
        if (chunk.scratch) {  // deterministic mode: this row's own slot (one copy)
          chunk.scratch[(static_cast<long>(t - chunk.r0) * chunk.slots + tile0 + k) * D + i] = acc[k][r];
          continue;
        }
        atomicAdd(key_grad_row(id, dkv_acc, dcomp_acc, D) + i, acc[k][r]);
      }
    }
    __syncthreads();  // ktile is rewritten next
  }

  // Pass 2: dQ, one head at a time, its sum over the tiles in registers.
  for (int h = 0; h < H; ++h) {
    float dqr[kMaxDimPerThread];
#pragma unroll
    for (int r = 0; r < kMaxDimPerThread; ++r) dqr[r] = 0.0f;
    load_head(h);  // the previous readers of qh / gh ended at the last barrier
    for (int tile0 = 0; tile0 < n; tile0 += kTile) {
      const int nk = min(kTile, n - tile0);
      load_tile(tile0, nk);
      __syncthreads();
      probabilities(h, nk);
      __syncthreads();
#pragma unroll
      for (int r = 0; r < kMaxDimPerThread; ++r) {
        const int i = threadIdx.x + r * kThreads;
        if (i >= D) continue;
#pragma unroll
        for (int k = 0; k < kTile; ++k) dqr[r] += dz[k] * ktile[k * D + i];
      }
      __syncthreads();  // ktile, p, dz are rewritten next
    }
    const long base = (static_cast<long>(t) * H + h) * D;
#pragma unroll
    for (int r = 0; r < kMaxDimPerThread; ++r) {
      const int i = threadIdx.x + r * kThreads;
      if (i < D) dq[base + i] = __float2bfloat16_rn(d.scale * dqr[r]);
    }
  }
}

// The one dispatch decision (launch_attention_backward and attention_backward_copies must
// agree): the wgmma kernel where it applies, else the mma.sync kernel, else the baseline;
// CSATTN_ATTENTION_BACKWARD=mma or =baseline forces an older kernel (benchmarks, bisecting).
enum class BackwardKernel { wgmma, mma, baseline };
BackwardKernel backward_kernel(const LayerDims& d) {
  static const std::string forced = kernel_switch("CSATTN_ATTENTION_BACKWARD", {"mma", "baseline"});
  if (forced != "baseline" && forced != "mma" && attention_backward_wgmma_supported(d))
    return BackwardKernel::wgmma;
  if (forced != "baseline" && attention_backward_mma_supported(d)) return BackwardKernel::mma;
  return BackwardKernel::baseline;
}

}  // namespace

void check_output_rows(const LayerDims& d, const OutputRows& out) {
  require(out.rows != nullptr && (out.tail == nullptr || out.tail_dim == attention_tail_dim(d)),
          ErrorKind::InvalidArgument,
          "the attention backward's O: whole rows, or heads with their tails of " +
              std::to_string(attention_tail_dim(d)) + " dims apart (got " + std::to_string(out.tail_dim) + ")");
}

void launch_attention_backward(const LayerDims& d, const DeviceMetadata& meta, const bf16* q,
                               const bf16* kv, const bf16* comp, const float* sink,
                               const std::int32_t* topk, OutputRows out, const float* lse,
                               const bf16* dout, bf16* dq, float* dkv_acc,
                               float* dcomp_acc, float* dsink_part, cudaStream_t stream,
                               const GradChunk& chunk) {
  // head_dim 512 (every DeepSeek-V4 preset) takes a tensor-core kernel; key lists too long
  // for their shared memory fall back to the baseline.
  switch (backward_kernel(d)) {
    case BackwardKernel::wgmma:
      launch_attention_backward_wgmma(d, meta, q, kv, comp, sink, topk, out, lse, dout, dq,
                                      dkv_acc, dcomp_acc, dsink_part, stream, chunk);
      return;
    case BackwardKernel::mma:
      launch_attention_backward_mma(d, meta, q, kv, comp, sink, topk, out, lse, dout, dq,
                                    dkv_acc, dcomp_acc, dsink_part, stream, chunk);
      return;
    case BackwardKernel::baseline:
      launch_attention_backward_baseline(d, meta, q, kv, comp, sink, topk, out, lse, dout, dq,
                                         dkv_acc, dcomp_acc, dsink_part, stream, chunk);
      return;
  }
}

int attention_backward_copies(const LayerDims& d) {
  return backward_kernel(d) == BackwardKernel::baseline ? 1 : (d.heads + 63) / 64;
}

const char* attention_backward_kernel_name(const LayerDims& d) {
  switch (backward_kernel(d)) {
    case BackwardKernel::wgmma: return "wgmma";
    case BackwardKernel::mma: return "mma";
    case BackwardKernel::baseline: return "baseline";
  }
  return "?";
}

void launch_attention_backward_baseline(const LayerDims& d, const DeviceMetadata& meta,
                                        const bf16* q, const bf16* kv, const bf16* comp,
                                        const float* sink, const std::int32_t* topk,
                                        OutputRows out, const float* lse, const bf16* dout,
                                        bf16* dq, float* dkv_acc, float* dcomp_acc,
                                        float* dsink_part, cudaStream_t stream,
                                        const GradChunk& chunk) {
  check_output_rows(d, out);
  const int rows = chunk.launch_rows(d.rows);
  if (rows <= 0) return;
  require(d.head_dim <= kThreads * kMaxDimPerThread, ErrorKind::Unsupported,
          "the CUDA attention backward supports head_dim up to 1024");
  const int max_keys = max_keys_per_query(d);
  const std::size_t smem = sizeof(float) * (static_cast<std::size_t>(kTile) * d.head_dim +
                                            2 * d.head_dim + d.heads + 2 * kTile) +
                           sizeof(int) * max_keys;
  require(smem <= 220 * 1024, ErrorKind::Unsupported,
          "the CUDA attention backward needs " + std::to_string(smem) + " bytes of shared memory");
  allow_dynamic_smem(attention_backward_kernel, smem, "the CUDA attention backward");
  attention_backward_kernel<<<rows, kThreads, smem, stream>>>(
      d, meta, q, kv, comp, sink, topk, out, lse, dout, dq, dkv_acc, dcomp_acc, dsink_part,
      chunk);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
