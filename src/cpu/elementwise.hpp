// Row-wise elementwise operators of the layer and their backward: RMSNorm (with and without
// weight), interleaved-pair RoPE, the orthonormal Hadamard rotation, bf16 rounding.
#pragma once
#include <cstdint>
#include <vector>

#include "csattn/tensor.hpp"

namespace csattn::cpu {

// Rounds n values to bf16 in place when `bf16` is set (the GPU path's storage points).
void round_to_storage(float* v, std::int64_t n, bool bf16);

// y = x / sqrt(mean(x^2) + eps) * w (w may be null: weightless). rows x n, row stride n.
// rstd[rows] receives 1/sqrt(mean(x^2)+eps) for the backward.
void rmsnorm_forward(const float* x, const float* w, int rows, int n, float eps, float* y,
                     float* rstd);
// dx = d(rmsnorm)/dx^T dy (overwrites dx); dw += sum_rows dy * x * rstd (if dw).
void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy,
                      int rows, int n, float* dx, float* dw);

// RoPE on the pairs of v[offset, offset + 2*half) at `position`: sign = +1 rotates by
// +theta (the forward rotation R_p), -1 by -theta (R_p^-1 = R_p^T). In bf16 mode cos/sin
// are bf16 (as the reference casts the table) and the result is rounded to bf16.
struct RopeTable {
  std::vector<float> omega;  // [half]
  int half = 0;
  bool bf16 = false;
  void rotate(float* v, int position, int sign) const;
};

// In-place orthonormal Walsh-Hadamard transform over n (a power of two) values. Symmetric
// and its own inverse, so the backward is the same call.
void hadamard(float* v, int n);

}  // namespace csattn::cpu
