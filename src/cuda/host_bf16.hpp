// Host-side bf16 conversions of the CUDA backend's uploads and downloads.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "csattn/tensor.hpp"

namespace csattn::cuda {

inline std::vector<std::uint16_t> to_bf16_bits(const float* v, std::size_t n) {
  std::vector<std::uint16_t> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = float_to_bf16_bits(v[i]);
  return out;
}

// A [rows, cols] f32 tensor of bf16 bit patterns.
inline Tensor tensor_from_bf16_bits(const std::vector<std::uint16_t>& bits, std::int64_t rows,
                                    std::int64_t cols) {
  Tensor t(DType::f32, {rows, cols});
  float* y = t.ptr<float>();
  for (std::size_t i = 0; i < bits.size(); ++i) y[i] = bf16_bits_to_float(bits[i]);
  return t;
}

}  // namespace csattn::cuda
