// MXFP8 on Hopper: the indexer's queries and keys rounded through MXFP8 (E4M3 values, one
// E8M0 scale per 32 elements) and stored back as bf16. Hopper has no block-scaled MMA, but
// the scales are powers of two: an E4M3 value (4 significant bits) times 2^(e - 127) is
// exactly a bf16, so the bf16 indexer on these operands computes the MXFP8 scores exactly
// ("the BF16 formula on the dequantized operands", docs/numerics.md) - the selection of
// Blackwell's MXFP8 indexer, on this hardware. The rules are the CPU's (src/cpu/mxfp8.cpp,
// src/core/tensor.cpp) spelled out bit for bit: NaN-propagating amax, the fp32 product
// amax * fp32(1/448) rounded up to a power of two, E4M3 rounding to nearest even with
// saturation to +-448, NaN -> 0x7F. (Blocks whose scale is below 2^-124 would need bf16
// subnormals below the bf16 range; their amax is under 1e-34.)
#include <cstdint>

#include "cuda/check.hpp"
#include "cuda/kernels.hpp"

namespace csattn::cuda {

namespace {

constexpr int kBlock = 32;  // elements per scale
constexpr float kInvE4m3Max = static_cast<float>(1.0 / 448.0);

__device__ __forceinline__ unsigned e8m0_from_amax(float amax) {
  if (isnan(amax)) return 0xFFu;
  if (isinf(amax)) return 0xFEu;
  if (amax == 0.0f) return 0u;
  const unsigned bits = __float_as_uint(__fmul_rn(amax, kInvE4m3Max));
  unsigned exponent = (bits >> 23) & 0xFFu;
  const unsigned mantissa = bits & 0x7FFFFFu;
  if (mantissa > 0 && exponent != 0xFEu && !(exponent == 0 && mantissa <= 0x400000u)) ++exponent;
  return exponent;
}

__device__ __forceinline__ unsigned e4m3_bits(float x) {
  if (isnan(x)) return 0x7Fu;
  const unsigned bits = __float_as_uint(x);
  const unsigned sign = (bits >> 24) & 0x80u;
  const unsigned a = bits & 0x7FFFFFFFu;
  if (a >= 0x43E00000u) return sign | 0x7Eu;  // 448 and above (Inf too) saturate
  if (a < 0x3C800000u)                         // below 2^-6: subnormal steps of 2^-9
    return sign | static_cast<unsigned>(__float2int_rn(__uint_as_float(a) * 512.0f));
  const unsigned rounded = (a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;  // (E << 3) | m, RNE
  return sign | (rounded - (120u << 3));
}

__device__ __forceinline__ float e4m3_value(unsigned v) {
  const unsigned e = (v >> 3) & 0xFu, m = v & 7u;
  float mag = e == 0 ? static_cast<float>(m) * 0.001953125f  // m * 2^-9
                     : ldexpf(1.0f + static_cast<float>(m) * 0.125f, static_cast<int>(e) - 7);
  if ((v & 0x7Fu) == 0x7Fu) mag = __int_as_float(0x7FC00000);
  return (v & 0x80u) ? -mag : mag;
}

// One thread per 32-element block: 4 x 16-byte loads, the scale, 32 conversions, 4 stores.
__global__ void mxfp8_roundtrip_kernel(long blocks, const bf16* in, bf16* out) {
  const long blk = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (blk >= blocks) return;
  const uint4* src = reinterpret_cast<const uint4*>(in + blk * kBlock);
  float v[kBlock];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const uint4 raw = src[c];
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      v[8 * c + 2 * i] = f.x;
      v[8 * c + 2 * i + 1] = f.y;
    }
  }
  float amax = 0.0f;
  bool nan = false;
#pragma unroll
  for (int i = 0; i < kBlock; ++i) {
    nan |= isnan(v[i]);
    amax = fmaxf(amax, fabsf(v[i]));
  }
  const unsigned e = e8m0_from_amax(nan ? __int_as_float(0x7FC00000) : amax);
  const float mult = e == 0 ? 1.0f : ldexpf(1.0f, 127 - static_cast<int>(e));
  const float back = e == 0xFFu ? __int_as_float(0x7FC00000) : ldexpf(1.0f, static_cast<int>(e) - 127);
  uint4* dst = reinterpret_cast<uint4*>(out + blk * kBlock);
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    uint4 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float x0 = __fmul_rn(e4m3_value(e4m3_bits(__fmul_rn(v[8 * c + 2 * i], mult))), back);
      const float x1 = __fmul_rn(e4m3_value(e4m3_bits(__fmul_rn(v[8 * c + 2 * i + 1], mult))), back);
      h[i] = __floats2bfloat162_rn(x0, x1);
    }
    dst[c] = raw;
  }
}

}  // namespace

void launch_mxfp8_roundtrip(const bf16* in, bf16* out, long rows, int cols, cudaStream_t stream) {
  require(cols % kBlock == 0, ErrorKind::Unsupported,
          "MXFP8 needs rows of a multiple of 32 elements, got " + std::to_string(cols));
  const long blocks = rows * (cols / kBlock);
  if (blocks <= 0) return;
  mxfp8_roundtrip_kernel<<<static_cast<unsigned>((blocks + 255) / 256), 256, 0, stream>>>(blocks, in, out);
  CSATTN_CUDA_LAUNCH_CHECK();
}

}  // namespace csattn::cuda
