// Gated pooling of the compressors. pooled[e, c] = sum_k softmax_k(g[k, c] + ape[slot k, c]) a[k, c]
// over the candidates k of compressed row e: m = 4, the previous block through the A half
// (columns [0, d)) and the block through the B half ([d, 2d)); m = 128, the block.
//
// The layer's kernel (compressor_pool_vec_kernel) is bandwidth-bound: a thread owns 4
// consecutive channels (8-byte loads of A and G, a float4 of ape, one 8-byte store) and
// kTok candidates, loads A and G of 8 candidates at once and keeps them in registers for the
// max pass and the exp-sum pass, so A and G are read once with many loads in flight. m = 128
// splits the 128 tokens over kSplit = 4 thread groups of a block and merges their (max, sum,
// acc) in shared memory in split order. The reference kernel (one thread per channel, three
// passes) is kept for shapes the vector kernel does not take (d % 4 != 0, d > 512 at
// m = 128) and as the test's second opinion.
#include "cuda/check.hpp"
#include "cuda/device_util.cuh"
#include "cuda/kernels.hpp"

namespace csattn::cuda {

namespace {

__global__ void compressor_pool_reference_kernel(int capacity, CompEntries entries, int d,
                                                 const bf16* a, const bf16* g,
                                                 const float* ape, bf16* pooled) {
  const long idx = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<long>(capacity) * d) return;
  const int e = static_cast<int>(idx / d), c = static_cast<int>(idx % d);
  const CompEntry ent = compressed_entry(entries, e);
  if (ent.row0 < 0) return;
  const int m = entries.ratio;
  const bool overlap = m == 4;
  const int width = overlap ? 2 * d : d;
  // Candidates: (token, column, slot). m = 4: block j-1 through the A half (if j > 0), then
  // block j through the B half; m = 128: block j.
  const int first_prev = overlap && ent.pos > 0 ? 0 : m;  // m means "no previous candidates"
  auto token_of = [&](int k) { return k < m ? ent.row0 - m + k : ent.row0 + (k - m); };
  auto col_of = [&](int k) { return k < m ? c : (overlap ? d + c : c); };
  auto slot_of = [&](int k) { return k < m ? k : k - m; };
  float mx = -INFINITY;
  for (int k = first_prev; k < 2 * m; ++k) {
    const float s = __bfloat162float(g[static_cast<long>(token_of(k)) * width + col_of(k)]) +
                    ape[slot_of(k) * width + col_of(k)];
    mx = fmaxf(mx, s);
  }
  float z = 0.0f;
  for (int k = first_prev; k < 2 * m; ++k) {
    const float s = __bfloat162float(g[static_cast<long>(token_of(k)) * width + col_of(k)]) +
                    ape[slot_of(k) * width + col_of(k)];
    z += expf(s - mx);
  }
  float acc = 0.0f;
  for (int k = first_prev; k < 2 * m; ++k) {
    const long at = static_cast<long>(token_of(k)) * width + col_of(k);
    const float s = __bfloat162float(g[at]) + ape[slot_of(k) * width + col_of(k)];
    acc += (expf(s - mx) / z) * __bfloat162float(a[at]);
  }
  pooled[static_cast<long>(e) * d + c] = __float2bfloat16_rn(acc);
}

// Geometry of the vector kernel per ratio: candidates per thread, token splits per row, and
// candidates whose A and G a thread loads at once (all in flight together).
template <int kM> struct PoolShape;
template <> struct PoolShape<4> { static constexpr int kTok = 8, kSplit = 1, kChunk = 8; };
// m = 128: chunks of 4. With chunks of 8 a 512-thread block took 104 registers and held an
// SM alone, with no loads in flight while its warps computed a chunk or merged their splits
// (0.69-0.72 of copy on the H200); at 4, 62 registers: two blocks an SM, one's arithmetic
// overlapping the other's loads, the same bytes in flight.
template <> struct PoolShape<128> { static constexpr int kTok = 32, kSplit = 4, kChunk = 4; };
constexpr int kPoolCh = 4;  // channels per thread: 8-byte bf16 loads, one float4 of ape
// Logits are kept in base 2 (times log2 e): exp2f is one MUFU instruction where expf is
// several, and at 4 channels x 8 candidates per thread the issue rate matters next to the
// loads.
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ void unpack4(const uint2& v, float (&f)[kPoolCh]) {
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v.y));
  f[0] = lo.x; f[1] = lo.y; f[2] = hi.x; f[3] = hi.y;
}

__device__ __forceinline__ void load_ape4(const float* ape, float (&f)[kPoolCh]) {
  const float4 x = __ldg(reinterpret_cast<const float4*>(ape));
  f[0] = x.x; f[1] = x.y; f[2] = x.z; f[3] = x.w;
}

template <int kM>
__global__ void __launch_bounds__(512)
    compressor_pool_vec_kernel(int capacity, CompEntries entries, int d, const bf16* a,
                               const bf16* g, const float* ape, bf16* pooled) {
  constexpr int kTok = PoolShape<kM>::kTok, kSplit = PoolShape<kM>::kSplit;
  constexpr int kChunk = PoolShape<kM>::kChunk;
  static_assert(kTok % kChunk == 0, "whole chunks");
  constexpr bool kOverlap = kM == 4;
  const int vecs = d / kPoolCh;  // channel groups per row
  int e, v, split;
  if constexpr (kSplit == 1) {
    const long idx = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= static_cast<long>(capacity) * vecs) return;
    e = static_cast<int>(idx / vecs);
    v = static_cast<int>(idx % vecs);
    split = 0;
  } else {
    e = blockIdx.x;
    v = threadIdx.x % vecs;
    split = threadIdx.x / vecs;
  }
  const CompEntry ent = e < capacity ? compressed_entry(entries, e) : CompEntry{-1, 0};
  const bool live = ent.row0 >= 0;
  if (kSplit == 1 && !live) return;  // split blocks return together below
  const int width = kOverlap ? 2 * d : d;
  const int c0 = kPoolCh * v;

  float mx[kPoolCh], z[kPoolCh], acc[kPoolCh];  // mx in base-2 logits
#pragma unroll
  for (int c = 0; c < kPoolCh; ++c) {
    mx[c] = -INFINITY;
    z[c] = 0.0f;
    acc[c] = 0.0f;
  }
  if (live) {
    const long block0 = ent.row0;
    // Candidate k of this thread: token, column and ape slot.
    const int k0 = split * kTok;
    const bool has_prev = kOverlap && ent.pos > 0;
    auto token = [&](int k) { return kOverlap ? (k < kM ? block0 - kM + k : block0 + (k - kM)) : block0 + k; };
    auto col = [&](int k) { return kOverlap && k >= kM ? d + c0 : c0; };
    auto slot = [&](int k) { return kOverlap && k >= kM ? k - kM : k; };
    auto valid = [&](int k) { return !kOverlap || k >= kM || has_prev; };
    // Per chunk: A and G loaded together, the chunk max, the running (max, sum, acc)
    // rescaled when the max rises, then the exp-sum.
#pragma unroll
    for (int k1 = k0; k1 < k0 + kTok; k1 += kChunk) {
      uint2 graw[kChunk], araw[kChunk];
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        const int k = k1 + i;
        const long at = token(k) * width + col(k);
        graw[i] = valid(k) ? __ldg(reinterpret_cast<const uint2*>(g + at)) : make_uint2(0u, 0u);
        araw[i] = valid(k) ? __ldg(reinterpret_cast<const uint2*>(a + at)) : make_uint2(0u, 0u);
      }
      float cm[kPoolCh];
#pragma unroll
      for (int c = 0; c < kPoolCh; ++c) cm[c] = mx[c];
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        const int k = k1 + i;
        if (!valid(k)) continue;
        float gs[kPoolCh], ap[kPoolCh];
        unpack4(graw[i], gs);
        load_ape4(ape + slot(k) * width + col(k), ap);
#pragma unroll
        for (int c = 0; c < kPoolCh; ++c) cm[c] = fmaxf(cm[c], (gs[c] + ap[c]) * kLog2e);
      }
#pragma unroll
      for (int c = 0; c < kPoolCh; ++c) {
        if (k1 != k0) {  // the first chunk starts from zero sums
          const float f = exp2f(mx[c] - cm[c]);
          z[c] *= f;
          acc[c] *= f;
        }
        mx[c] = cm[c];
      }
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        const int k = k1 + i;
        if (!valid(k)) continue;
        float gs[kPoolCh], ap[kPoolCh], av[kPoolCh];
        unpack4(graw[i], gs);
        unpack4(araw[i], av);
        load_ape4(ape + slot(k) * width + col(k), ap);
#pragma unroll
        for (int c = 0; c < kPoolCh; ++c) {
          const float p = exp2f((gs[c] + ap[c]) * kLog2e - mx[c]);
          z[c] += p;
          acc[c] += p * av[c];
        }
      }
    }
  }
  if constexpr (kSplit > 1) {
    // Merge the splits: the row max, then each split's (z, acc) rescaled to it, summed in
    // split order by split 0.
    extern __shared__ float red[];  // [2][kSplit][d]
    float* rz = red;
    float* racc = red + kSplit * d;
#pragma unroll
    for (int c = 0; c < kPoolCh; ++c) rz[split * d + c0 + c] = mx[c];
    __syncthreads();
    float row_mx[kPoolCh];
#pragma unroll
    for (int c = 0; c < kPoolCh; ++c) {
      row_mx[c] = -INFINITY;
      for (int s2 = 0; s2 < kSplit; ++s2) row_mx[c] = fmaxf(row_mx[c], rz[s2 * d + c0 + c]);
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < kPoolCh; ++c) {
      const float f = mx[c] == -INFINITY ? 0.0f : exp2f(mx[c] - row_mx[c]);
      rz[split * d + c0 + c] = z[c] * f;
      racc[split * d + c0 + c] = acc[c] * f;
    }
    __syncthreads();
    if (split != 0 || !live) return;
#pragma unroll
    for (int c = 0; c < kPoolCh; ++c) {
      z[c] = 0.0f;
      acc[c] = 0.0f;
      for (int s2 = 0; s2 < kSplit; ++s2) {
        z[c] += rz[s2 * d + c0 + c];
        acc[c] += racc[s2 * d + c0 + c];
      }
    }
  }
  uint2 out;
  *reinterpret_cast<__nv_bfloat162*>(&out.x) = __floats2bfloat162_rn(acc[0] / z[0], acc[1] / z[1]);
  *reinterpret_cast<__nv_bfloat162*>(&out.y) = __floats2bfloat162_rn(acc[2] / z[2], acc[3] / z[3]);
  *reinterpret_cast<uint2*>(pooled + static_cast<long>(e) * d + c0) = out;
}

bool pool_vec_supported(const LayerDims& d, int width_d) {
  if (width_d % kPoolCh != 0) return false;
  if (d.ratio == 4) return true;
  return d.ratio == 128 && width_d / kPoolCh * PoolShape<128>::kSplit <= 512;
}

}  // namespace

void launch_compressor_pool(const LayerDims& d, const DeviceMetadata& meta, int width_d,
                            const bf16* a, const bf16* g, const float* ape, bf16* pooled,
                            cudaStream_t stream) {
  if (d.comp_capacity <= 0 || width_d <= 0) return;
  if (!pool_vec_supported(d, width_d)) {
    launch_compressor_pool_reference(d, meta, width_d, a, g, ape, pooled, stream);
    return;
  }
  if (d.ratio == 4) {
    const long threads = static_cast<long>(d.comp_capacity) * (width_d / kPoolCh);
    compressor_pool_vec_kernel<4><<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(
        d.comp_capacity, comp_entries(d, meta), width_d, a, g, ape, pooled);
  } else {
    constexpr int kSplit = PoolShape<128>::kSplit;
    const std::size_t smem = 2 * sizeof(float) * kSplit * static_cast<std::size_t>(width_d);
    compressor_pool_vec_kernel<128><<<static_cast<unsigned>(d.comp_capacity), (width_d / kPoolCh) * kSplit, smem, stream>>>(
        d.comp_capacity, comp_entries(d, meta), width_d, a, g, ape, pooled);
  }
  CSATTN_CUDA_LAUNCH_CHECK();
}

void launch_compressor_pool_reference(const LayerDims& d, const DeviceMetadata& meta, int width_d,
                            const bf16* a, const bf16* g, const float* ape, bf16* pooled,
                            cudaStream_t stream) {
  const long total = static_cast<long>(d.comp_capacity) * width_d;
  if (total <= 0) return;
  compressor_pool_reference_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(
      d.comp_capacity, comp_entries(d, meta), width_d, a, g, ape, pooled);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
