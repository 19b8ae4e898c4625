// RMSNorm backward (row kernels for dx, fixed-order column kernel for the weight), plus the
// small reductions and conversions the backward shares. Two row kernels: a warp a row with
// vector loads, the row in registers between its sums and its output (widths n = 32 V, V in
// 4, 8, 16, 24, 32, 48: every DeepSeek-V4 norm - heads 512, the q rank 1024 / 1536, the
// indexer's 128); a block a row for any other width (and the reference the bench compares
// with: scalar 2-byte loads, two block reductions, x and dy read twice).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/backward_kernels.hpp"
#include "cuda/check.hpp"
#include "cuda/device_util.cuh"
#include "cuda/kernels.hpp"

namespace csattn::cuda {

namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads)
    rmsnorm_backward_kernel(const bf16* x, const bf16* weight, const bf16* dy, int n, float eps,
                            bf16* dx, float* rstd, const float* given_rstd,
                            const std::int32_t* comp_start, int segments) {
  __shared__ float scratch[32];
  const int row = blockIdx.x;
  if (comp_start && row >= comp_start[segments]) return;
  const bf16* xr = x + static_cast<long>(row) * n;
  const bf16* gr = dy + static_cast<long>(row) * n;
  float ss = 0.0f, dot = 0.0f;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float xv = __bfloat162float(xr[i]);
    const float w = weight ? __bfloat162float(weight[i]) : 1.0f;
    ss += xv * xv;
    dot += __bfloat162float(gr[i]) * w * xv;
  }
  ss = block_sum(ss, scratch);
  dot = block_sum(dot, scratch);
  // From the input x: r = 1 / rms(x), dx = r dy w - r^3 x <dy w, x> / n. From the weightless
  // norm's output y = r x and its stored r: the same, r (dy - y <dy, y> / n).
  const float r = given_rstd ? given_rstd[row] : 1.0f / sqrtf(ss / n + eps);
  const float c = given_rstd ? r * dot / n : r * r * r * dot / n;
  bf16* out = dx + static_cast<long>(row) * n;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float w = weight ? __bfloat162float(weight[i]) : 1.0f;
    out[i] = __float2bfloat16_rn(r * __bfloat162float(gr[i]) * w - c * __bfloat162float(xr[i]));
  }
  if (rstd != nullptr && threadIdx.x == 0) rstd[row] = r;
}

// The same, a warp a row: lane l holds elements (32 k + l) kVec .. + kVec - 1 of load k (16- or
// 8-byte loads, coalesced across the warp), sums by warp_sum (a fixed order). With
// rope.rope_dim > 0 (token rows, a table), dx is then rotated like launch_norm_rope would
// rotate it in a second pass - the same bf16 rounding of dx first, the same products - so
// the fused pass gives that pass's bits without writing and reading dx in between.
template <int kV>
__global__ void __launch_bounds__(256)
    rmsnorm_backward_warp_kernel(const bf16* x, const bf16* weight, const bf16* dy, int rows, int n,
                                 float eps, bf16* dx, float* rstd, const float* given_rstd,
                                 const std::int32_t* comp_start, int segments, NormRopeArgs rope) {
  constexpr int kVec = kV % 8 == 0 ? 8 : 4;  // bf16 a load
  constexpr int kLoads = kV / kVec;
  using Vec = std::conditional_t<kVec == 8, uint4, uint2>;
  union Pack {
    Vec v;
    __nv_bfloat162 h[kVec / 2];
  };
  const int lane = threadIdx.x & 31;
  const int used = comp_start ? min(rows, comp_start[segments]) : rows;
  // The weight as fp32, element i of this lane (load i / kVec, place i % kVec). Up to 16 a
  // lane it stays in registers; wider rows keep it in shared memory, since x, dy and w in
  // registers (3 kV floats) took 158 / 221 registers at kV = 32 / 48: one 256-thread block an
  // SM, too few loads in flight for the H200's memory (the cq backward at 0.67-0.69 of copy
  // there). Now 123 at kV = 32: two blocks an SM. (kV = 48 stays at one: x and dy alone are
  // 96 floats.)
  constexpr bool kSharedWeight = kV > 16;
  __shared__ float4 w_shared[kSharedWeight ? 8 * kV : 1];  // 32 kV floats
  float w_reg[kSharedWeight ? 1 : kV];
  auto set_w = [&](int i, float v) {
    if constexpr (kSharedWeight)
      reinterpret_cast<float*>(w_shared)[((i / 4) * 32 + lane) * 4 + i % 4] = v;
    else
      w_reg[i] = v;
  };
  if (!kSharedWeight || threadIdx.x < 32) {
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      Pack p;
      if (weight) p.v = reinterpret_cast<const Vec*>(weight)[k * 32 + lane];
#pragma unroll
      for (int e = 0; e < kVec / 2; ++e) {
        const float2 f = weight ? __bfloat1622float2(p.h[e]) : make_float2(1.0f, 1.0f);
        set_w(k * kVec + 2 * e, f.x);
        set_w(k * kVec + 2 * e + 1, f.y);
      }
    }
  }
  if constexpr (kSharedWeight) __syncthreads();
  // The lane's elements i .. i + 3 (i a multiple of 4): from registers, or one float4 of
  // shared memory, where the warp's 32 float4s for the same i lie side by side (512
  // contiguous bytes a read: no bank conflicts).
  auto w4 = [&](int i) -> float4 {
    if constexpr (kSharedWeight)
      return w_shared[(i / 4) * 32 + lane];
    else
      return make_float4(w_reg[i], w_reg[i + 1], w_reg[i + 2], w_reg[i + 3]);
  };
  const int warps = blockDim.x / 32;
  for (int row = blockIdx.x * warps + (threadIdx.x >> 5); row < used; row += gridDim.x * warps) {
    const Vec* xr = reinterpret_cast<const Vec*>(x + static_cast<long>(row) * n);
    const Vec* gr = reinterpret_cast<const Vec*>(dy + static_cast<long>(row) * n);
    float xv[kV], gv[kV];
    float ss = 0.0f, dot = 0.0f;
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      Pack a, b;
      a.v = xr[k * 32 + lane];
      b.v = gr[k * 32 + lane];
#pragma unroll
      for (int e = 0; e < kVec / 2; ++e) {
        const float2 fa = __bfloat1622float2(a.h[e]), fb = __bfloat1622float2(b.h[e]);
        xv[k * kVec + 2 * e] = fa.x;
        xv[k * kVec + 2 * e + 1] = fa.y;
        gv[k * kVec + 2 * e] = fb.x;
        gv[k * kVec + 2 * e + 1] = fb.y;
      }
    }
#pragma unroll
    for (int i = 0; i < kV; i += 4) {
      const float4 wv = w4(i);
      const float wi[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        ss += xv[i + j] * xv[i + j];
        dot += gv[i + j] * wi[j] * xv[i + j];
      }
    }
    ss = warp_sum(ss);
    dot = warp_sum(dot);
    const float r = given_rstd ? given_rstd[row] : 1.0f / sqrtf(ss / n + eps);
    const float c = given_rstd ? r * dot / n : r * r * r * dot / n;
    Vec* out = reinterpret_cast<Vec*>(dx + static_cast<long>(row) * n);
    const int base = n - rope.rope_dim;  // the rotated dims: [base, n) (none: n)
    const __nv_bfloat162* table =
        rope.rope_dim > 0 ? rope.rope_table + static_cast<long>(rope.row_position[row / rope.rows_per_token]) *
                                                  (rope.rope_dim / 2)
                          : nullptr;
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      Pack o;
      float wk[kVec];
#pragma unroll
      for (int j = 0; j < kVec; j += 4) {
        const float4 wv = w4(k * kVec + j);
        wk[j] = wv.x;
        wk[j + 1] = wv.y;
        wk[j + 2] = wv.z;
        wk[j + 3] = wv.w;
      }
#pragma unroll
      for (int e = 0; e < kVec / 2; ++e) {
        const int i = k * kVec + 2 * e;
        float d0 = r * gv[i] * wk[2 * e] - c * xv[i], d1 = r * gv[i + 1] * wk[2 * e + 1] - c * xv[i + 1];
        const int elem = (k * 32 + lane) * kVec + 2 * e;
        if (table != nullptr && elem >= base) {
          const float2 cs = __bfloat1622float2(table[(elem - base) / 2]);
          d0 = round_bf16(d0);
          d1 = round_bf16(d1);
          rotate_pair(d0, d1, cs.x, cs.y * static_cast<float>(rope.rope_sign));
        }
        o.h[e] = __floats2bfloat162_rn(d0, d1);
      }
      out[k * 32 + lane] = o.v;
    }
    if (rstd != nullptr && lane == 0) rstd[row] = r;
  }
}

// The weight gradient's first stage: partial[chunk][i] = sum over the rows of row chunk
// blockIdx.y of dy[r, i] x[r, i] rstd[r] for the 64 columns of block x (a lane two of them,
// 4-byte loads: a warp reads 128 contiguous bytes of a row). Warp w sums rows w, w + 8, ... of
// the chunk in order, then the 8 warps' sums in order. The chunks split the rows in use
// (device-side: comp_start) evenly.
__global__ void __launch_bounds__(256)
    rmsnorm_weight_partial_kernel(const bf16* x, const bf16* dy, const float* rstd, int rows, int n,
                                  float* partial, const std::int32_t* comp_start, int segments) {
  __shared__ float2 warp_part[8][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int col = blockIdx.x * 64 + 2 * lane;
  const int used = comp_start ? min(rows, comp_start[segments]) : rows;
  const int per = (used + static_cast<int>(gridDim.y) - 1) / static_cast<int>(gridDim.y);
  const int r0 = static_cast<int>(blockIdx.y) * per, r1 = min(used, r0 + per);
  float2 acc = make_float2(0.0f, 0.0f);
  if (col < n)
    for (int r = r0 + warp; r < r1; r += 8) {
      const float rs = rstd[r];
      const long k = static_cast<long>(r) * n + col;
      const float2 g = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dy + k));
      const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(x + k));
      acc.x += g.x * v.x * rs;
      acc.y += g.y * v.y * rs;
    }
  warp_part[warp][lane] = acc;
  __syncthreads();
  if (warp == 0 && col < n) {
    float2 s = warp_part[0][lane];
#pragma unroll
    for (int w = 1; w < 8; ++w) {
      s.x += warp_part[w][lane].x;
      s.y += warp_part[w][lane].y;
    }
    float* dst = partial + static_cast<long>(blockIdx.y) * n + col;
    dst[0] = s.x;
    dst[1] = s.y;
  }
}

// dweight[i] += sum_rows dy[r, i] x[r, i] rstd[r], rows in order (one thread a column: the
// reference's weight gradient, and the fallback for odd widths).
__global__ void rmsnorm_weight_grad_kernel(const bf16* x, const bf16* dy, const float* rstd,
                                           int rows, int n, float* dweight,
                                           const std::int32_t* comp_start, int segments) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int used = comp_start ? min(rows, comp_start[segments]) : rows;
  float acc = 0.0f;
  for (int r = 0; r < used; ++r) {
    const long k = static_cast<long>(r) * n + i;
    acc += __bfloat162float(dy[k]) * __bfloat162float(x[k]) * rstd[r];
  }
  dweight[i] += acc;
}

// launch_column_sum's first stage: block (x, y) sums columns 32 x .. 32 x + 31 over the rows
// of chunk y (warp w: rows w, w + 8, ... in order; then the 8 warps in order) and writes the
// sum into the chunk's first row (after every warp of the block has read the chunk).
__global__ void __launch_bounds__(256) column_chunk_sum_kernel(float* part, int rows, int cols, int per) {
  __shared__ float warp_part[8][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int col = blockIdx.x * 32 + lane;
  const int r0 = static_cast<int>(blockIdx.y) * per, r1 = min(rows, r0 + per);
  float acc = 0.0f;
  if (col < cols)
    for (int r = r0 + warp; r < r1; r += 8) acc += part[static_cast<long>(r) * cols + col];
  warp_part[warp][lane] = acc;
  __syncthreads();
  if (warp == 0 && col < cols && r0 < rows) {
    float s = warp_part[0][lane];
#pragma unroll
    for (int w = 1; w < 8; ++w) s += warp_part[w][lane];
    part[static_cast<long>(r0) * cols + col] = s;
  }
}

// The second stage: dst[i] += the chunks' sums in chunk order.
__global__ void column_sum_kernel(const float* part, int rows, int cols, int per, float* dst) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= cols) return;
  float acc = 0.0f;
  for (int r = 0; r < rows; r += per) acc += part[static_cast<long>(r) * cols + i];
  dst[i] += acc;
}

__global__ void f32_to_bf16_kernel(const float* src, bf16* dst, long n) {
  const long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = __float2bfloat16_rn(src[i]);
}

// The row kernel for width n: the warp kernel where it has an instance (and `reference` is
// false), else the block kernel.
// rope (rope_dim > 0): rotate dx after, fused into the warp kernel where it can take it (token
// rows with a table), else by launch_norm_rope on dx.
void launch_rows(const bf16* x, const bf16* weight, const bf16* dy, int rows, int n, float eps,
                 bf16* dx, float* rstd, const float* given_rstd, const std::int32_t* comp_start,
                 int segments, bool reference, cudaStream_t stream, NormRopeArgs rope = {}) {
  // The warp kernel's loads are 16 bytes where n / 32 is a multiple of 8, else 8 bytes: a
  // caller's pointer (a view into a larger tensor) off that alignment takes the block kernel.
  const auto aligned = [&](const void* p) {
    const std::uintptr_t a = (n / 32) % 8 == 0 ? 16 : 8;
    return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % a == 0;
  };
  auto warp_kernel = [&]() -> decltype(&rmsnorm_backward_warp_kernel<4>) {
    if (reference || n % 128 != 0) return nullptr;
    if (!aligned(x) || !aligned(weight) || !aligned(dy) || !aligned(dx)) return nullptr;
    switch (n / 32) {
      case 4: return rmsnorm_backward_warp_kernel<4>;
      case 8: return rmsnorm_backward_warp_kernel<8>;
      case 16: return rmsnorm_backward_warp_kernel<16>;
      case 24: return rmsnorm_backward_warp_kernel<24>;
      case 32: return rmsnorm_backward_warp_kernel<32>;
      case 48: return rmsnorm_backward_warp_kernel<48>;
      default: return nullptr;
    }
  }();
  const bool fuse_rope = rope.rope_dim > 0 && rope.rope_table != nullptr && !rope.compressed &&
                         rope.row_position != nullptr && rope.hadamard == false && !rope.norm &&
                         rope.rope_dim % 2 == 0 && rope.rope_dim <= n && n % 2 == 0;
  if (warp_kernel != nullptr) {
    NormRopeArgs fused;  // rope_dim 0: none
    if (fuse_rope) fused = rope;
    // 8 rows a block; a few blocks an SM, each walking rows with a grid stride.
    const long blocks = std::min<long>((rows + 7) / 8, 8l * multiprocessor_count());
    warp_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(x, weight, dy, rows, n, eps, dx, rstd,
                                                                  given_rstd, comp_start, segments, fused);
  } else {
    rmsnorm_backward_kernel<<<rows, kThreads, 0, stream>>>(x, weight, dy, n, eps, dx, rstd, given_rstd,
                                                           comp_start, segments);
  }
  CSATTN_CUDA_LAUNCH_CHECK();
  if (rope.rope_dim > 0 && (warp_kernel == nullptr || !fuse_rope)) {  // a pass of its own
    rope.in = dx;
    rope.out = dx;
    launch_norm_rope(rope, stream);
  }
}

}  // namespace

void launch_rmsnorm_backward(const bf16* x, const bf16* weight, const bf16* dy, int rows, int n,
                             float eps, bf16* dx, float* dweight, float* rstd,
                             const std::int32_t* comp_start, int segments, cudaStream_t stream,
                             bool reference) {
  if (rows <= 0) return;
  require(rstd != nullptr, ErrorKind::InvalidArgument, "launch_rmsnorm_backward: the rstd scratch is required");
  launch_rows(x, weight, dy, rows, n, eps, dx, rstd, nullptr, comp_start, segments, reference, stream);
  if (dweight && !reference && n % 2 == 0) {  // chunk partials, then the chunks in order
    float* partial = rstd + rows;
    const dim3 grid(static_cast<unsigned>((n + 63) / 64), kNormWeightChunks);
    rmsnorm_weight_partial_kernel<<<grid, 256, 0, stream>>>(x, dy, rstd, rows, n, partial, comp_start, segments);
    CSATTN_CUDA_LAUNCH_CHECK();
    launch_column_sum(partial, kNormWeightChunks, n, dweight, stream);
  } else if (dweight) {
    rmsnorm_weight_grad_kernel<<<(n + 127) / 128, 128, 0, stream>>>(x, dy, rstd, rows, n, dweight,
                                                                    comp_start, segments);
    CSATTN_CUDA_LAUNCH_CHECK();
  }
}

void launch_rmsnorm_backward_from_output(const bf16* y, const float* rstd, const bf16* dy, int rows,
                                         int n, bf16* dx, cudaStream_t stream, bool reference,
                                         const NormRopeArgs* rope_after) {
  if (rows <= 0) return;
  launch_rows(y, nullptr, dy, rows, n, 0.0f, dx, nullptr, rstd, nullptr, 0, reference, stream,
              rope_after != nullptr ? *rope_after : NormRopeArgs{});
}

void launch_column_sum(float* part, int rows, int cols, float* dst, cudaStream_t stream) {
  if (cols <= 0 || rows <= 0) return;
  const int chunks = std::min(rows, kColumnSumChunks), per = (rows + chunks - 1) / chunks;
  if (per > 1) {  // one row a chunk: the rows are the chunks' sums already
    const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>((rows + per - 1) / per));
    column_chunk_sum_kernel<<<grid, 256, 0, stream>>>(part, rows, cols, per);
    CSATTN_CUDA_LAUNCH_CHECK();
  }
  column_sum_kernel<<<(cols + 127) / 128, 128, 0, stream>>>(part, rows, cols, per, dst);
  CSATTN_CUDA_LAUNCH_CHECK();
}

void launch_f32_to_bf16(const float* src, bf16* dst, long n, cudaStream_t stream) {
  if (n <= 0) return;
  f32_to_bf16_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(src, dst, n);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
