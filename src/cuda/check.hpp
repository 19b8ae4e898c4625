// Error checks for CUDA runtime and cuBLAS calls: a failing call throws csattn::Error naming
// the call, the file and line, and the driver's message.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "csattn/error.hpp"

namespace csattn::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* what, const char* file,
                                     int line);

// Lets `kernel` use up to the device's opt-in shared-memory maximum (set once per kernel and
// process: the attribute is process-global, so setting it per launch to that launch's size
// would race between layers on different threads). Throws csattn::Error (Unsupported, with
// `what` in the message) when `bytes` exceeds the maximum.
void allow_dynamic_smem(const void* kernel, std::size_t bytes, const char* what);
template <class Kernel>
void allow_dynamic_smem(Kernel* kernel, std::size_t bytes, const char* what) {
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes, what);
}

// The most dynamic shared memory `kernel` can take per block on the current device: the
// opt-in maximum less the kernel's static shared memory. The kernels' "supported" checks
// compare with it, so a shape they accept also passes allow_dynamic_smem.
std::size_t dynamic_smem_limit(const void* kernel);
template <class Kernel>
std::size_t dynamic_smem_limit(Kernel* kernel) {
  return dynamic_smem_limit(reinterpret_cast<const void*>(kernel));
}

// How many clusters of `config`'s shape (its cluster-dimension attribute, block size and
// dynamic shared memory) of `kernel` fit on the current device at once; 0 when none does.
// Asked of the runtime once per (device, kernel, shared-memory size), under a lock.
int max_active_clusters(const void* kernel, const cudaLaunchConfig_t& config);
template <class Kernel>
int max_active_clusters(Kernel* kernel, const cudaLaunchConfig_t& config) {
  return max_active_clusters(reinterpret_cast<const void*>(kernel), config);
}

// Multiprocessors of the current device (persistent kernels size their grids by it; asked
// per call, so threads driving different GPUs each get their own).
int multiprocessor_count();

}  // namespace csattn::cuda

#define CSATTN_CUDA_CHECK(call)                                                        \
  do {                                                                                 \
    cudaError_t csattn_err_ = (call);                                                  \
    if (csattn_err_ != cudaSuccess)                                                    \
      ::csattn::cuda::throw_cuda_error(csattn_err_, #call, __FILE__, __LINE__);        \
  } while (0)

#define CSATTN_CUBLAS_CHECK(call)                                                      \
  do {                                                                                 \
    cublasStatus_t csattn_st_ = (call);                                                \
    if (csattn_st_ != CUBLAS_STATUS_SUCCESS)                                           \
      ::csattn::cuda::throw_cublas_error(csattn_st_, #call, __FILE__, __LINE__);       \
  } while (0)

// After a kernel launch: catches bad launch configurations at once (no sync).
#define CSATTN_CUDA_LAUNCH_CHECK() CSATTN_CUDA_CHECK(cudaGetLastError())
