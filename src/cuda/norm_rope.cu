// RMSNorm + RoPE + Hadamard on rows, with the bf16 rounding points of docs/numerics.md.
// Rows of width 128..1024 (a power of two times 32, the model's shapes) take the
// warp-per-row kernel: each lane owns n/32 contiguous elements, loaded with 16-byte (or
// 8-byte) accesses, the norm is a warp reduction, RoPE pairs never straddle lanes, and the
// Hadamard butterflies below the lane width run in registers, the wider ones through
// shuffles - the same additions in the same order as the block kernel, which stays for
// other widths; rows of 128 take a 4-lanes-per-row variant (fewer cross-lane Hadamard
// levels, see norm_rope_n128_kernel). cos / sin come from the per-run table (one double-precision evaluation
// per position and frequency instead of one per row).
#include <cmath>
#include <cstdint>

#include "cuda/check.hpp"
#include "cuda/device_util.cuh"
#include "cuda/kernels.hpp"

namespace csattn::cuda {

namespace {

constexpr int kThreads = 128;

// cos / sin of position * omega[i] with the sign of the rotation applied to sin: from the
// table, or (no table) through double so they are correctly rounded like the host's, then
// cast to bf16 (the table's dtype). Angles in fp32 as the reference builds them.
__device__ __forceinline__ float2 rope_entry(const float* omega, int position, int i) {
  const float angle = static_cast<float>(position) * omega[i];
  return make_float2(round_bf16(static_cast<float>(cos(static_cast<double>(angle)))),
                     round_bf16(static_cast<float>(sin(static_cast<double>(angle)))));
}
__device__ __forceinline__ void rope_cos_sin(const NormRopeArgs& a, int position, int i,
                                             float& c, float& s) {
  float2 cs;
  if (a.rope_table) {
    cs = __bfloat1622float2(a.rope_table[static_cast<long>(position) * (a.rope_dim / 2) + i]);
  } else {
    cs = rope_entry(a.omega, position, i);
  }
  c = cs.x;
  s = cs.y * static_cast<float>(a.rope_sign);
}

__global__ void rope_table_kernel(int positions, int half, const float* omega,
                                  __nv_bfloat162* table) {
  const long idx = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<long>(positions) * half) return;
  const float2 cs = rope_entry(omega, static_cast<int>(idx / half), static_cast<int>(idx % half));
  table[idx] = __floats2bfloat162_rn(cs.x, cs.y);
}

// The position of a row (token rows: row_position of its token; compressed rows: j * m), or
// -1 for compressed capacity rows without an entry.
__device__ __forceinline__ int row_position_of(const NormRopeArgs& a, int row) {
  if (a.compressed) {
    if (a.comp_entry_pos != nullptr) return a.comp_entry_pos[row];  // -1: an unused slot
    if (row >= a.comp_start[a.segments]) return -1;
    const int b = compressed_segment(a.comp_start, a.segments, row);
    return (row - a.comp_start[b]) * a.ratio;
  }
  return a.rope_dim > 0 ? a.row_position[row / a.rows_per_token] : 0;
}

constexpr int kWarpsPerBlock = 4;

// E contiguous bf16 of a lane: 16-byte pieces where E allows, else 8-byte ones.
template <int E>
__device__ __forceinline__ void load_lane(const bf16* p, float (&v)[E]) {
  if constexpr (E % 8 == 0) {
#pragma unroll
    for (int c = 0; c < E; c += 8) {
      const uint4 raw = *reinterpret_cast<const uint4*>(p + c);
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(h[i]);
        v[c + 2 * i] = f.x;
        v[c + 2 * i + 1] = f.y;
      }
    }
  } else {
#pragma unroll
    for (int c = 0; c < E; c += 4) {
      const uint2 raw = *reinterpret_cast<const uint2*>(p + c);
      const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
      const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
      v[c] = lo.x;
      v[c + 1] = lo.y;
      v[c + 2] = hi.x;
      v[c + 3] = hi.y;
    }
  }
}

template <int E>
__device__ __forceinline__ void store_lane(bf16* p, const float (&v)[E]) {
  if constexpr (E % 8 == 0) {
#pragma unroll
    for (int c = 0; c < E; c += 8) {
      uint4 raw;
      __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
      for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[c + 2 * i], v[c + 2 * i + 1]);
      *reinterpret_cast<uint4*>(p + c) = raw;
    }
  } else {
#pragma unroll
    for (int c = 0; c < E; c += 4) {
      uint2 raw;
      *reinterpret_cast<__nv_bfloat162*>(&raw.x) = __floats2bfloat162_rn(v[c], v[c + 1]);
      *reinterpret_cast<__nv_bfloat162*>(&raw.y) = __floats2bfloat162_rn(v[c + 2], v[c + 3]);
      *reinterpret_cast<uint2*>(p + c) = raw;
    }
  }
}

// Norm, RoPE and Hadamard of row `row` held by a warp (lane: elements [lane*E, lane*E + E)).
template <int E>
__device__ __forceinline__ void transform_row(const NormRopeArgs& a, int row, int position, int lane,
                                              float (&v)[E]) {
  constexpr int n = 32 * E;
  const int first = lane * E;
  if (a.norm) {
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < E; ++i) ss += v[i] * v[i];
    ss = warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / n + a.eps);
    if (a.rstd != nullptr && lane == 0) a.rstd[row] = r;
    if (a.weight) {
      float w[E];
      load_lane<E>(a.weight + first, w);
#pragma unroll
      for (int i = 0; i < E; ++i) v[i] = round_bf16(v[i] * r * w[i]);
    } else {
#pragma unroll
      for (int i = 0; i < E; ++i) v[i] = round_bf16(v[i] * r);
    }
  }

  if (a.rope_dim > 0) {
    const int base = n - a.rope_dim;
#pragma unroll
    for (int i = 0; i < E; i += 2) {
      const int e = first + i;
      if (e < base) continue;
      // The table only: the double-precision fallback would put the trig slow path's
      // stack frame into this kernel.
      const float2 cs =
          __bfloat1622float2(a.rope_table[static_cast<long>(position) * (a.rope_dim / 2) + (e - base) / 2]);
      rotate_pair(v[i], v[i + 1], cs.x, cs.y * static_cast<float>(a.rope_sign));
    }
  }

  if (a.hadamard) {
#pragma unroll
    for (int len = 1; len < E; len <<= 1)
#pragma unroll
      for (int i = 0; i < E; ++i)
        if ((i & len) == 0) {
          const float x0 = v[i], x1 = v[i + len];
          v[i] = x0 + x1;
          v[i + len] = x0 - x1;
        }
#pragma unroll
    for (int lanes = 1; lanes < 32; lanes <<= 1) {
      const bool upper = (lane & lanes) != 0;  // holds the x1 side of each pair
#pragma unroll
      for (int i = 0; i < E; ++i) {
        const float other = __shfl_xor_sync(0xffffffffu, v[i], lanes);
        v[i] = upper ? other - v[i] : v[i] + other;
      }
    }
    const float scale = 1.0f / sqrtf(static_cast<float>(n));
#pragma unroll
    for (int i = 0; i < E; ++i) v[i] = round_bf16(v[i] * scale);
  }
}

// R rows per warp, all loaded before any is transformed: narrow rows (n = 128: 256 bytes a
// row) need several per warp to keep enough loads in flight. Row validity is warp-uniform,
// so the warp's shuffles always have every lane.
template <int E, int R>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) norm_rope_warp_kernel(NormRopeArgs a) {
  constexpr int n = 32 * E;
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5)) * R;
  float v[R][E];
  int position[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int row = row0 + r;
    position[r] = row < a.rows ? row_position_of(a, row) : -1;  // -1: nothing to do
    if (position[r] >= 0) load_lane<E>(a.in + static_cast<long>(row) * n + lane * E, v[r]);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (position[r] < 0) continue;
    transform_row<E>(a, row0 + r, position[r], lane, v[r]);
    store_lane<E>(a.out + static_cast<long>(row0 + r) * n + lane * E, v[r]);
  }
}

// Rows of 128 (the indexer's queries and keys) in groups of 4 lanes, 8 rows per warp at
// once. Lane l of a group holds the 16-byte chunks l + 4c (c < 4), i.e. elements
// 8 (l + 4c) + k (k < 8), in v[8c + k]: each load instruction reads chunk c of 8 rows with
// 4 lanes on 64 contiguous bytes, RoPE pairs stay inside a lane, and of the Hadamard's 7
// levels only len 8 and 16 (the lane bits) cross lanes: 8 shuffles a row where the 32-lane
// layout needs 20. Levels run in the same order with the same operations, so without the
// norm the result is bitwise the 32-lane kernel's. Every lane runs every shuffle (rows
// past the end or without an entry compute on zeros and store nothing).
__global__ void __launch_bounds__(32 * kWarpsPerBlock) norm_rope_n128_kernel(NormRopeArgs a) {
  constexpr int n = 128, C = 4;  // chunks of 8 elements per lane
  const int lane = threadIdx.x & 31, gl = lane & 3;
  const int row = (blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5)) * 8 + (lane >> 2);
  const int position = row < a.rows ? row_position_of(a, row) : -1;
  const bool live = position >= 0;
  auto elem = [&](int c) { return 8 * (gl + 4 * c); };  // first element of chunk c
  float v[8 * C];
  const bf16* in = a.in + static_cast<long>(live ? row : 0) * n;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    float x[8];
    if (live) {
      load_lane<8>(in + elem(c), x);
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) x[k] = 0.0f;
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) v[8 * c + k] = x[k];
  }

  if (a.norm) {
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < 8 * C; ++i) ss += v[i] * v[i];
    ss += __shfl_xor_sync(0xffffffffu, ss, 1);
    ss += __shfl_xor_sync(0xffffffffu, ss, 2);
    const float r = 1.0f / sqrtf(ss / n + a.eps);
    if (a.rstd != nullptr && live && gl == 0) a.rstd[row] = r;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      float w[8];
      if (a.weight) {
        load_lane<8>(a.weight + elem(c), w);
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) w[k] = 1.0f;
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) v[8 * c + k] = a.weight ? round_bf16(v[8 * c + k] * r * w[k]) : round_bf16(v[8 * c + k] * r);
    }
  }

  if (a.rope_dim > 0) {
    const int base = n - a.rope_dim;
    const __nv_bfloat162* table = a.rope_table + static_cast<long>(live ? position : 0) * (a.rope_dim / 2);
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int k = 0; k < 8; k += 2) {
        const int e = elem(c) + k;
        if (e < base) continue;
        const float2 cs = __bfloat1622float2(table[(e - base) / 2]);
        rotate_pair(v[8 * c + k], v[8 * c + k + 1], cs.x, cs.y * static_cast<float>(a.rope_sign));
      }
  }

  if (a.hadamard) {
    // len 1, 2, 4: inside a chunk.
#pragma unroll
    for (int len = 1; len < 8; len <<= 1)
#pragma unroll
      for (int i = 0; i < 8 * C; ++i)
        if ((i & len) == 0) {
          const float x0 = v[i], x1 = v[i + len];
          v[i] = x0 + x1;
          v[i + len] = x0 - x1;
        }
    // len 8, 16: the lane bits of the group. The lower lane keeps x0 + x1, the upper x0 - x1:
    // other + s v with s = +-1, one FFMA where a select and an add took two (the product is
    // exact, so the bits are the add's). On the H200 this kernel issues about as fast as
    // the memory moves its bytes: instructions are its cost.
#pragma unroll
    for (int lanes = 1; lanes < 4; lanes <<= 1) {
      const float s = (gl & lanes) != 0 ? -1.0f : 1.0f;  // -1: holds the x1 side of each pair
#pragma unroll
      for (int i = 0; i < 8 * C; ++i) v[i] = fmaf(v[i], s, __shfl_xor_sync(0xffffffffu, v[i], lanes));
    }
    // len 32, 64: across the lane's chunks (chunk bit 0, then 1).
#pragma unroll
    for (int cb = 1; cb < C; cb <<= 1)
#pragma unroll
      for (int i = 0; i < 8 * C; ++i)
        if (((i >> 3) & cb) == 0) {
          const float x0 = v[i], x1 = v[i + 8 * cb];
          v[i] = x0 + x1;
          v[i + 8 * cb] = x0 - x1;
        }
    // Scaled, not rounded here: the store rounds to bf16 (the same bits, one conversion).
    const float scale = 1.0f / sqrtf(static_cast<float>(n));
#pragma unroll
    for (int i = 0; i < 8 * C; ++i) v[i] *= scale;
  }

  if (!live) return;
  bf16* out = a.out + static_cast<long>(row) * n;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    float x[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) x[k] = v[8 * c + k];
    store_lane<8>(out + elem(c), x);
  }
}

// RoPE alone, in place (the layer's inverse RoPE of the attention output, the backward's
// RoPE^T passes; on [T*H, 512] rows 64 dims rotate): only each row's tail is read and written
// - 1/8 of the bytes the whole-row kernels move there, whose other elements would go through
// fp32 and back unchanged. The tail is the row's last `span` elements (rope_dim, or
// keep_tail_dim >= rope_dim where the values before the rotation are kept: those go to
// keep_tail first; the span's elements before the rotated dims are kept and left as they
// are). Every rotation goes through rotate_pair with the table's cos / sin: the whole-row
// kernels' bits. Two kernels: rope_tail_vec_kernel where the span, the rows and the pointers
// allow 16-byte pieces (the layer's shapes), else rope_tail_kernel, a thread a pair.
constexpr int kTailThreads = 256;

// A thread takes 16 bytes (4 pairs) of the span, in each of kTailRowsPerThread rows: at a
// 64-element span, 8 threads a row, a warp 4 rows x 128 contiguous bytes an access. Its loads
// (rows, then the rows' positions and table entries) are all issued before the first use. The
// thread-a-pair kernel moved 4 bytes a thread behind a 64-bit division and two dependent
// metadata loads: 0.49 of copy on an H100 at [16K*64, 512] (perf.md, nineteenth session).
constexpr int kTailRowsPerThread = 2;
__global__ void __launch_bounds__(kTailThreads) rope_tail_vec_kernel(NormRopeArgs a, int span) {
  const int groups = span / 8;                  // 16-byte pieces a row
  const int rows_per_pass = kTailThreads / groups;  // rows a block covers per pass
  const int local = threadIdx.x / groups, g = threadIdx.x - local * groups;
  if (local >= rows_per_pass) return;  // the block's last threads when groups does not divide it
  const int e = a.n - span + 8 * g;    // the piece's first element in its row
  const int rot0 = e - (a.n - a.rope_dim);  // the rotated dims' offset of its first pair
  const long row0 = static_cast<long>(blockIdx.x) * rows_per_pass * kTailRowsPerThread + local;
  uint4 v[kTailRowsPerThread];
  int position[kTailRowsPerThread];
#pragma unroll
  for (int r = 0; r < kTailRowsPerThread; ++r) {
    const long row = row0 + static_cast<long>(r) * rows_per_pass;
    position[r] = row < a.rows ? row_position_of(a, static_cast<int>(row)) : -1;
    if (position[r] >= 0) v[r] = *reinterpret_cast<const uint4*>(a.out + row * a.n + e);
  }
  const float sign = static_cast<float>(a.rope_sign);
#pragma unroll
  for (int r = 0; r < kTailRowsPerThread; ++r) {
    if (position[r] < 0) continue;  // past the rows, or a compressed capacity row without an entry
    const long row = row0 + static_cast<long>(r) * rows_per_pass;
    if (a.keep_tail != nullptr) *reinterpret_cast<uint4*>(a.keep_tail + row * span + 8 * g) = v[r];
    if (rot0 + 8 <= 0) continue;  // before the rotated dims: kept only
    const __nv_bfloat162* cs_row = a.rope_table + static_cast<long>(position[r]) * (a.rope_dim / 2);
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v[r]);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int rot = rot0 + 2 * i;
      if (rot < 0) continue;
      float2 x = __bfloat1622float2(h[i]);
      const float2 cs = __bfloat1622float2(cs_row[rot / 2]);
      rotate_pair(x.x, x.y, cs.x, cs.y * sign);
      h[i] = __floats2bfloat162_rn(x.x, x.y);
    }
    *reinterpret_cast<uint4*>(a.out + row * a.n + e) = v[r];
  }
}

// A thread a pair of the span (a warp: 128 contiguous bytes of a 64-pair tail), for spans,
// rows or pointers that do not allow 16-byte pieces. kPairs: 4-byte pair accesses (even rows
// and tails), else two 2-byte ones.
template <bool kPairs>
__global__ void __launch_bounds__(kTailThreads) rope_tail_kernel(NormRopeArgs a, int span) {
  const int pairs = span / 2;
  const long idx = static_cast<long>(blockIdx.x) * kTailThreads + threadIdx.x;
  const long row = idx / pairs;
  if (row >= a.rows) return;
  const int position = row_position_of(a, static_cast<int>(row));
  if (position < 0) return;  // compressed capacity rows without an entry
  const int j = static_cast<int>(idx - row * pairs);
  const int e = a.n - span + 2 * j;  // the pair's first element in its row
  bf16* p = a.out + row * a.n + e;
  float x0, x1;
  if constexpr (kPairs) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
    x0 = f.x;
    x1 = f.y;
  } else {
    x0 = __bfloat162float(p[0]);
    x1 = __bfloat162float(p[1]);
  }
  if (a.keep_tail != nullptr) {
    bf16* k = a.keep_tail + row * span + 2 * j;
    if constexpr (kPairs) {
      *reinterpret_cast<__nv_bfloat162*>(k) = *reinterpret_cast<const __nv_bfloat162*>(p);
    } else {
      k[0] = p[0];
      k[1] = p[1];
    }
  }
  const int rot = e - (a.n - a.rope_dim);  // the rotated dims' offset of this pair
  if (rot < 0) return;  // before the rotated dims: kept only
  const float2 cs = __bfloat1622float2(a.rope_table[static_cast<long>(position) * (a.rope_dim / 2) + rot / 2]);
  rotate_pair(x0, x1, cs.x, cs.y * static_cast<float>(a.rope_sign));
  if constexpr (kPairs) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x0, x1);
  } else {
    p[0] = __float2bfloat16_rn(x0);
    p[1] = __float2bfloat16_rn(x1);
  }
}

__global__ void __launch_bounds__(kThreads) norm_rope_kernel(NormRopeArgs a) {
  extern __shared__ float buf[];  // [n]
  __shared__ float scratch[32];
  const int row = blockIdx.x;
  const int n = a.n;
  const int position = row_position_of(a, row);
  if (position < 0) return;  // compressed capacity rows without an entry
  const bf16* in = a.in + static_cast<long>(row) * n;
  for (int i = threadIdx.x; i < n; i += kThreads) buf[i] = __bfloat162float(in[i]);
  __syncthreads();

  if (a.norm) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += kThreads) ss += buf[i] * buf[i];
    ss = block_sum(ss, scratch);
    const float r = 1.0f / sqrtf(ss / n + a.eps);
    if (a.rstd != nullptr && threadIdx.x == 0) a.rstd[row] = r;
    for (int i = threadIdx.x; i < n; i += kThreads) {
      const float w = a.weight ? __bfloat162float(a.weight[i]) : 1.0f;
      buf[i] = round_bf16(buf[i] * r * w);
    }
    __syncthreads();
  }

  if (a.rope_dim > 0) {
    const int half = a.rope_dim / 2, base = n - a.rope_dim;
    for (int i = threadIdx.x; i < half; i += kThreads) {
      // Angles in fp32 as the reference builds them; cos / sin through double so they are
      // correctly rounded like the host's, then cast to bf16 (the table's dtype).
      float c, s;
      rope_cos_sin(a, position, i, c, s);
      rotate_pair(buf[base + 2 * i], buf[base + 2 * i + 1], c, s);
    }
    __syncthreads();
  }

  if (a.hadamard) {
    for (int len = 1; len < n; len <<= 1) {
      for (int p = threadIdx.x; p < n / 2; p += kThreads) {
        const int blk = p / len, off = p % len;
        const int i = blk * 2 * len + off, j = i + len;
        const float x0 = buf[i], x1 = buf[j];
        buf[i] = x0 + x1;
        buf[j] = x0 - x1;
      }
      __syncthreads();
    }
    const float scale = 1.0f / sqrtf(static_cast<float>(n));
    for (int i = threadIdx.x; i < n; i += kThreads) buf[i] = round_bf16(buf[i] * scale);
    __syncthreads();
  }

  bf16* out = a.out + static_cast<long>(row) * n;
  for (int i = threadIdx.x; i < n; i += kThreads) out[i] = __float2bfloat16_rn(buf[i]);
}

}  // namespace

void launch_rope_table(const LayerDims& d, const float* omega, __nv_bfloat162* table,
                       cudaStream_t stream) {
  const long total = static_cast<long>(d.max_seg_len) * (d.rope_dim / 2);
  if (total <= 0 || table == nullptr) return;
  rope_table_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(
      d.max_seg_len, d.rope_dim / 2, omega, table);
  CSATTN_CUDA_LAUNCH_CHECK();
}

namespace {
// The in-place tail kernels' span: the kept tail where one is kept, else the rotated dims.
int tail_span(const NormRopeArgs& a) { return a.keep_tail != nullptr ? a.keep_tail_dim : a.rope_dim; }
}  // namespace

NormRopePath norm_rope_path(const NormRopeArgs& a) {
  if (a.rows <= 0) return NormRopePath::none;
  // RoPE alone in place: the tail kernels. The values before the rotation are kept only by them.
  const bool tail_only = a.in == a.out && !a.norm && !a.hadamard && a.rstd == nullptr && a.rope_dim > 0 &&
                         a.rope_table != nullptr;
  require(a.keep_tail == nullptr || (tail_only && a.keep_tail_dim >= a.rope_dim && a.keep_tail_dim <= a.n &&
                                     a.keep_tail_dim % 2 == 0),
          ErrorKind::InvalidArgument,
          "launch_norm_rope keeps the tail only for RoPE alone, in place, with the RoPE table and "
          "rope_dim <= keep_tail_dim <= n, even");
  if (tail_only) {
    const int span = tail_span(a);
    const std::uintptr_t tail_bits = reinterpret_cast<std::uintptr_t>(a.out) | reinterpret_cast<std::uintptr_t>(a.keep_tail);
    // 16-byte pieces need whole pieces a span and a row, aligned rows, and a row's pieces within
    // one block's threads.
    if (span % 8 == 0 && span <= 8 * kTailThreads && a.n % 8 == 0 && tail_bits % 16 == 0)
      return NormRopePath::tail_vec;
    return a.n % 2 == 0 && tail_bits % 4 == 0 ? NormRopePath::tail_pair : NormRopePath::tail_pair_unaligned;
  }
  // The warp kernels: n = 128 (4 lanes a row), or n = 32 * E with E in {8, 16, 32} (E even, so
  // RoPE pairs stay inside a lane), 16-byte aligned rows and weight, and the RoPE table when it
  // rotates.
  const bool rope_ok = a.rope_dim == 0 || (a.rope_table && a.rope_dim % 2 == 0 && a.rope_dim <= a.n);
  const std::uintptr_t addr_bits = reinterpret_cast<std::uintptr_t>(a.in) |
                                   reinterpret_cast<std::uintptr_t>(a.out) |
                                   reinterpret_cast<std::uintptr_t>(a.weight);
  if (rope_ok && addr_bits % 16 == 0) {
    switch (a.n) {
      case 128: return NormRopePath::warp_n128;
      case 256: return NormRopePath::warp_n256;
      case 512: return NormRopePath::warp_n512;
      case 1024: return NormRopePath::warp_n1024;
      default: break;
    }
  }
  return NormRopePath::reference;
}

void launch_norm_rope(const NormRopeArgs& a, cudaStream_t stream) {
  const NormRopePath path = norm_rope_path(a);
  const int span = tail_span(a);
  // The thread-a-pair kernels: a thread per rotated pair of the span.
  auto pair_blocks = [&] {
    return static_cast<unsigned>((static_cast<long>(a.rows) * (span / 2) + kTailThreads - 1) / kTailThreads);
  };
  auto warp_launch = [&](auto kernel, int rows_per_warp) {
    const int rows_per_block = kWarpsPerBlock * rows_per_warp;
    kernel<<<static_cast<unsigned>((a.rows + rows_per_block - 1) / rows_per_block), 32 * kWarpsPerBlock, 0,
             stream>>>(a);
  };
  switch (path) {
    case NormRopePath::none: return;
    case NormRopePath::tail_vec: {
      const long rows_per_block = static_cast<long>(kTailThreads / (span / 8)) * kTailRowsPerThread;
      rope_tail_vec_kernel<<<static_cast<unsigned>((a.rows + rows_per_block - 1) / rows_per_block), kTailThreads, 0,
                             stream>>>(a, span);
      break;
    }
    case NormRopePath::tail_pair: rope_tail_kernel<true><<<pair_blocks(), kTailThreads, 0, stream>>>(a, span); break;
    case NormRopePath::tail_pair_unaligned:
      rope_tail_kernel<false><<<pair_blocks(), kTailThreads, 0, stream>>>(a, span);
      break;
    case NormRopePath::warp_n128: warp_launch(norm_rope_n128_kernel, 8); break;  // 4 lanes a row, 8 rows a warp
    case NormRopePath::warp_n256: warp_launch(norm_rope_warp_kernel<8, 2>, 2); break;
    case NormRopePath::warp_n512: warp_launch(norm_rope_warp_kernel<16, 1>, 1); break;
    case NormRopePath::warp_n1024: warp_launch(norm_rope_warp_kernel<32, 2>, 2); break;
    case NormRopePath::reference: launch_norm_rope_reference(a, stream); return;
  }
  CSATTN_CUDA_LAUNCH_CHECK();
}

void launch_norm_rope_reference(const NormRopeArgs& a, cudaStream_t stream) {
  if (a.rows <= 0) return;
  const std::size_t smem = sizeof(float) * static_cast<std::size_t>(a.n);
  allow_dynamic_smem(norm_rope_kernel, smem, "the norm / RoPE kernel");
  norm_rope_kernel<<<a.rows, kThreads, smem, stream>>>(a);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
