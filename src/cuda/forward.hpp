// The forward of one layer on the GPU: a fixed sequence of kernel launches on one stream.
// No allocation and no host synchronisation: every buffer is in ForwardParams.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <vector>

#include "cuda/params.hpp"

namespace csattn::cuda {

// Optional per-stage timing: events recorded between stages (bench only).
struct StageTimer {
  std::vector<const char*> names;
  std::vector<cudaEvent_t> events;  // names.size() + 1 recorded events
};

void run_forward(const ForwardParams& p, cublasHandle_t blas, cudaStream_t stream,
                 StageTimer* timer = nullptr);

}  // namespace csattn::cuda
