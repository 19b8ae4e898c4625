// Error checks for CUDA runtime and cuBLAS calls: a failing call throws csattn::Error naming
// the call, the file and line, and the driver's message.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "csattn/error.hpp"

namespace csattn::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* what, const char* file,
                                     int line);

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
