// Random benchmark inputs drawn on the device (bench/cuda_bench_lib.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda/params.hpp"

namespace csattn::bench {

// Fills `n` bf16 values of device memory with N(0, scale^2) draws (cuRAND on the device).
void fill_random_bf16(cuda::bf16* dev, std::size_t n, std::uint64_t seed, float scale = 1.0f);

}  // namespace csattn::bench
