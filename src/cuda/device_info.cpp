#include "cuda/device_info.hpp"

#include <cuda_runtime.h>

#include <string>

#ifndef CSATTN_CUDA_TARGET
#error "CSATTN_CUDA_TARGET comes from CMake (CSATTN_CUDA_ARCH)"
#endif

namespace csattn::cuda {

void describe_devices(BuildInfo& b) {
  b.cuda_target = CSATTN_CUDA_TARGET;  // from CMakeLists.txt's CSATTN_CUDA_ARCH
  b.cuda_runtime_version = CUDART_VERSION;
  int driver = 0;
  if (cudaDriverGetVersion(&driver) == cudaSuccess) b.cuda_driver_version = driver;
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    b.gpu_note = err != cudaSuccess ? std::string("no usable CUDA device (") + cudaGetErrorString(err) + ")"
                                    : std::string("no CUDA device");
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
    g.runs_kernels = p.major == 9 && p.minor == 0;
    b.gpus.push_back(g);
  }
}

}  // namespace csattn::cuda
