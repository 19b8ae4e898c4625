#include "cuda/device_info.hpp"

#include <cuda_runtime.h>

#include <string>
#include <utility>

#ifndef CSATTN_CUDA_TARGET
#error "CSATTN_CUDA_TARGET comes from CMake (CSATTN_CUDA_ARCH)"
#endif

namespace csattn::cuda {

namespace {

// "sm_90a" -> (9, 0): the one compute capability the kernels run on (an "a" target is for
// exactly that capability).
std::pair<int, int> target_capability() {
  const std::string t = CSATTN_CUDA_TARGET;
  const std::size_t d = t.find_first_of("0123456789");
  const int v = std::stoi(t.substr(d));
  return {v / 10, v % 10};
}

}  // namespace

void describe_backend(BuildInfo& b) {
  b.cuda_target = CSATTN_CUDA_TARGET;  // from CMakeLists.txt's CSATTN_CUDA_ARCH
  b.cuda_runtime_version = CUDART_VERSION;
  int driver = 0;
  if (cudaDriverGetVersion(&driver) == cudaSuccess) b.cuda_driver_version = driver;
}

void describe_devices(BuildInfo& b) {
  describe_backend(b);
  const auto [major, minor] = target_capability();
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error of a failed query
    return;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    GpuInfo g;
    g.index = i;
    g.name = p.name;
    g.major = p.major;
    g.minor = p.minor;
    g.multiprocessors = p.multiProcessorCount;
    g.memory_bytes = p.totalGlobalMem;
    g.smem_per_block_optin = p.sharedMemPerBlockOptin;
    g.runs_kernels = p.major == major && p.minor == minor;
    b.gpus.push_back(g);
  }
}

}  // namespace csattn::cuda
