// An independent MXFP8 reference for the tests, written from the format definitions (not
// from the library): the E4M3 grid, nearest-value rounding with ties to the even code, and
// Megatron's reference quantizer (scale = 2^ceil(log2(amax / 448)), data = E4M3(x / scale)).
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

namespace csattn::testing_util {

// Value of the non-negative E4M3 code c (0..126): subnormals m * 2^-9, normals
// (1 + m/8) * 2^(E-7).
inline double e4m3_grid(int c) {
  const int E = c >> 3, m = c & 7;
  return E == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, E - 7);
}

// Nearest E4M3 code by exhaustive search; ties to the even code (even mantissa); saturates
// at 448; NaN -> 0x7F.
inline std::uint8_t ref_e4m3(double x) {
  if (std::isnan(x)) return 0x7F;
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(x);
  if (a >= 448.0) return sign | 0x7E;
  int best = 0;
  for (int c = 1; c <= 126; ++c) {
    const double d = std::fabs(e4m3_grid(c) - a), db = std::fabs(e4m3_grid(best) - a);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return sign | static_cast<std::uint8_t>(best);
}

// ceil(log2(v)) exactly, for v > 0.
inline int ceil_log2(double v) {
  int e = 0;
  const double f = std::frexp(v, &e);  // v = f 2^e, f in [0.5, 1)
  return f == 0.5 ? e - 1 : e;
}

// Megatron's _reference_quantize for finite, non-zero blocks.
inline void ref_quantize_block(const float* x, std::uint8_t* data, std::uint8_t* scale) {
  double amax = 0.0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
  if (amax == 0.0) {
    *scale = 0;
    for (int i = 0; i < 32; ++i) data[i] = std::signbit(x[i]) ? 0x80 : 0x00;
    return;
  }
  const int e = ceil_log2(amax / 448.0);
  *scale = static_cast<std::uint8_t>(127 + e);
  for (int i = 0; i < 32; ++i) data[i] = ref_e4m3(std::ldexp(static_cast<double>(x[i]), -e));
}

}  // namespace csattn::testing_util
