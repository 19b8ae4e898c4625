// A grow-only device allocation: the layers' workspaces grow outside their runs (never
// inside one, so a run allocates nothing) and keep their largest size.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/check.hpp"

namespace csattn::cuda {

struct DeviceArena {
  void* base = nullptr;
  std::size_t capacity = 0;

  DeviceArena() = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena() {
    if (base) cudaFree(base);
  }
  // At least `bytes` bytes; a larger request frees the old block (its contents are lost).
  unsigned char* reserve(std::size_t bytes) {
    if (bytes > capacity) {
      if (base) CSATTN_CUDA_CHECK(cudaFree(base));
      base = nullptr;
      capacity = 0;
      CSATTN_CUDA_CHECK(cudaMalloc(&base, bytes));
      capacity = bytes;
    }
    return static_cast<unsigned char*>(base);
  }
  unsigned char* at(std::size_t off) const { return static_cast<unsigned char*>(base) + off; }
};

}  // namespace csattn::cuda
