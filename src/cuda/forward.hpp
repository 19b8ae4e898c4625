// The forward of one layer on the GPU: a fixed sequence of kernel launches on one stream.
// No allocation and no host synchronisation: every buffer is in ForwardParams.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <vector>

#include "cuda/check.hpp"
#include "cuda/params.hpp"

namespace csattn::cuda {

// Optional per-stage timing: events recorded between stages (bench only).
struct StageTimer {
  std::vector<const char*> names;
  std::vector<cudaEvent_t> events;  // names.size() + 1 recorded events
};

// The marks of a launch sequence (forward and backward): mark(nullptr) once at the start,
// then mark(stage) after each stage's launches. A no-op without a timer.
struct Stages {
  StageTimer* timer;
  cudaStream_t stream;
  void mark(const char* name) {
    if (!timer) return;
    cudaEvent_t e;
    CSATTN_CUDA_CHECK(cudaEventCreate(&e));
    CSATTN_CUDA_CHECK(cudaEventRecord(e, stream));
    timer->events.push_back(e);
    if (name) timer->names.push_back(name);
  }
};

void run_forward(const ForwardParams& p, cublasHandle_t blas, cudaStream_t stream,
                 StageTimer* timer = nullptr);

}  // namespace csattn::cuda
