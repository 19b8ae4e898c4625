#include "cpu/mxfp8.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/mxfp8_layout.hpp"
#include "csattn/tensor.hpp"

namespace csattn::cpu::mxfp8 {

using csattn::mxfp8::kBlock;

float block_amax(const float* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return x[i];
    amax = std::max(amax, std::fabs(x[i]));
  }
  return amax;
}

std::uint8_t e8m0_from_amax(float amax) {
  if (std::isnan(amax)) return 0xFF;
  if (std::isinf(amax)) return 0xFE;
  if (amax == 0.0f) return 0x00;
  // fp32 product, as the GPU computes it (not the exact quotient amax / 448).
  constexpr float kInvE4m3Max = static_cast<float>(1.0 / 448.0);
  const float val = amax * kInvE4m3Max;
  const auto bits = std::bit_cast<std::uint32_t>(val);
  auto exponent = static_cast<std::uint8_t>((bits >> 23) & 0xFF);
  const std::uint32_t mantissa = bits & 0x7FFFFF;
  // Round up unless exact; 0xFE saturates; an fp32 denormal <= 2^-127 (mantissa <= half) is
  // already covered by byte 0 = 2^-127.
  if (mantissa > 0 && exponent != 0xFE && !(exponent == 0 && mantissa <= 0x400000)) ++exponent;
  return exponent;
}

float quant_multiplier(std::uint8_t e) {
  return e == 0 ? 1.0f : std::ldexp(1.0f, 127 - static_cast<int>(e));
}

namespace {

void quantize_row(const float* x, int cols, std::uint8_t* data, std::uint8_t* scales) {
  for (int g = 0; g < cols / kBlock; ++g) {
    const float* blk = x + g * kBlock;
    const std::uint8_t e = e8m0_from_amax(block_amax(blk, kBlock));
    const float mult = quant_multiplier(e);
    scales[g] = e;
    for (int i = 0; i < kBlock; ++i) data[g * kBlock + i] = float_to_e4m3_bits(blk[i] * mult);
  }
}

}  // namespace

void quantize_rows(const float* x, std::int64_t rows, int cols, std::uint8_t* data,
                   std::uint8_t* scales) {
  const int groups = cols / kBlock;
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < rows; ++r)
    quantize_row(x + r * cols, cols, data + r * cols, scales + r * groups);
}

void quantize_rows_bf16(const std::uint16_t* x, std::int64_t rows, int cols,
                        std::uint8_t* data, std::uint8_t* scales) {
  const int groups = cols / kBlock;
#pragma omp parallel
  {
    std::vector<float> row(static_cast<std::size_t>(cols));
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      for (int i = 0; i < cols; ++i) row[i] = bf16_bits_to_float(x[r * cols + i]);
      quantize_row(row.data(), cols, data + r * cols, scales + r * groups);
    }
  }
}

namespace {

// e4m3_bits_to_float for all 256 bytes, computed once (the decoder runs in the scoring loop).
const float* e4m3_table() {
  static const auto table = [] {
    std::array<float, 256> t{};
    for (int v = 0; v < 256; ++v) t[v] = e4m3_bits_to_float(static_cast<std::uint8_t>(v));
    return t;
  }();
  return table.data();
}

}  // namespace

void dequantize_block(const std::uint8_t* data, std::uint8_t scale, float* out) {
  const float* e4m3 = e4m3_table();
  const float s = e8m0_bits_to_float(scale);
  for (int i = 0; i < kBlock; ++i) out[i] = e4m3[data[i]] * s;
}

void dequantize_rows(const std::uint8_t* data, const std::uint8_t* scales, std::int64_t rows,
                     int cols, float* out) {
  const int groups = cols / kBlock;
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < rows; ++r)
    for (int g = 0; g < groups; ++g) {
      const std::int64_t v = r * cols + std::int64_t{g} * kBlock;
      dequantize_block(data + v, scales[r * groups + g], out + v);
    }
}

void pack_scales_bshd(const std::uint8_t* logical, std::int64_t slices,
                      std::int64_t rows_per_slice, int groups, std::int64_t rows_padded,
                      int groups_padded, std::uint8_t* packed) {
  const std::int64_t slice_bytes = rows_padded * groups_padded;
  std::memset(packed, 0, static_cast<std::size_t>(slices * slice_bytes));
#pragma omp parallel for schedule(static)
  for (std::int64_t l = 0; l < slices; ++l)
    for (std::int64_t m = 0; m < rows_per_slice; ++m)
      for (int g = 0; g < groups; ++g)
        packed[l * slice_bytes + csattn::mxfp8::scale_byte_offset(m, g, groups_padded)] =
            logical[(l * rows_per_slice + m) * groups + g];
}

void pack_scales_thd(const std::uint8_t* logical, std::span<const std::int32_t> cu_seqlens,
                     std::span<const std::int32_t> prefixes, int rows_per_token, int groups,
                     int groups_padded, std::uint8_t* packed, std::int64_t packed_bytes) {
  std::memset(packed, 0, static_cast<std::size_t>(packed_bytes));
  const auto segments = static_cast<std::int64_t>(cu_seqlens.size()) - 1;
#pragma omp parallel for schedule(dynamic, 1)
  for (std::int64_t b = 0; b < segments; ++b) {
    const std::int64_t first_row = std::int64_t{cu_seqlens[b]} * rows_per_token;
    const std::int64_t rows = std::int64_t{cu_seqlens[b + 1] - cu_seqlens[b]} * rows_per_token;
    const std::int64_t base = std::int64_t{prefixes[b]} * rows_per_token;
    for (std::int64_t i = 0; i < rows; ++i)
      for (int g = 0; g < groups; ++g)
        packed[csattn::mxfp8::scale_byte_offset(base + i, g, groups_padded)] =
            logical[(first_row + i) * groups + g];
  }
}

}  // namespace csattn::cpu::mxfp8
