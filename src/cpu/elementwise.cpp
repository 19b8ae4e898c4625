#include "cpu/elementwise.hpp"

#include <cmath>

namespace csattn::cpu {

void round_to_storage(float* v, std::int64_t n, bool bf16) {
  if (!bf16) return;
  for (std::int64_t i = 0; i < n; ++i) v[i] = round_bf16(v[i]);
}

void rmsnorm_forward(const float* x, const float* w, int rows, int n, float eps, float* y,
                     float* rstd) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<std::int64_t>(r) * n;
    float* yr = y + static_cast<std::int64_t>(r) * n;
    double ss = 0.0;
    for (int i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float s = static_cast<float>(1.0 / std::sqrt(ss / n + eps));
    if (rstd) rstd[r] = s;
    for (int i = 0; i < n; ++i) yr[i] = xr[i] * s * (w ? w[i] : 1.0f);
  }
}

void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy,
                      int rows, int n, float* dx, float* dw) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<std::int64_t>(r) * n;
    const float* gr = dy + static_cast<std::int64_t>(r) * n;
    float* dxr = dx + static_cast<std::int64_t>(r) * n;
    const double s = rstd[r];
    double dot = 0.0;  // sum_i (dy_i w_i) x_i
    for (int i = 0; i < n; ++i) dot += static_cast<double>(gr[i]) * (w ? w[i] : 1.0f) * xr[i];
    const double c = s * s * s * dot / n;
    for (int i = 0; i < n; ++i)
      dxr[i] = static_cast<float>(s * gr[i] * (w ? w[i] : 1.0f) - c * xr[i]);
  }
  if (dw) {
    // Weight gradient: a column sum over rows, kept serial per column block so the result
    // does not depend on the thread count.
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; ++i) {
      double acc = 0.0;
      for (int r = 0; r < rows; ++r) {
        const std::int64_t k = static_cast<std::int64_t>(r) * n + i;
        acc += static_cast<double>(dy[k]) * x[k] * rstd[r];
      }
      dw[i] += static_cast<float>(acc);
    }
  }
}

void RopeTable::rotate(float* v, int position, int sign) const {
  for (int i = 0; i < half; ++i) {
    const float angle = static_cast<float>(position) * omega[i];
    float c = std::cos(angle), s = std::sin(angle) * static_cast<float>(sign);
    if (bf16) { c = round_bf16(c); s = round_bf16(s); }
    const float a = v[2 * i], b = v[2 * i + 1];
    float ra = a * c - b * s, rb = a * s + b * c;
    if (bf16) { ra = round_bf16(ra); rb = round_bf16(rb); }
    v[2 * i] = ra;
    v[2 * i + 1] = rb;
  }
}

void hadamard(float* v, int n) {
  for (int len = 1; len < n; len <<= 1)
    for (int i = 0; i < n; i += 2 * len)
      for (int j = i; j < i + len; ++j) {
        const float a = v[j], b = v[j + len];
        v[j] = a + b;
        v[j + len] = a - b;
      }
  const float scale = 1.0f / std::sqrt(static_cast<float>(n));
  for (int i = 0; i < n; ++i) v[i] *= scale;
}

}  // namespace csattn::cpu
