// Median device time of a piece of stream work, from CUDA events around each repetition
// (after untimed warm-ups). Used by the layer's profiling and by the GPU benchmarks.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "cuda/check.hpp"

namespace csattn::cuda {

template <class F>
double median_event_ms(F&& run, cudaStream_t stream, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) run();
  cudaEvent_t a, b;
  CSATTN_CUDA_CHECK(cudaEventCreate(&a));
  CSATTN_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> v;
  for (int i = 0; i < std::max(iters, 1); ++i) {
    CSATTN_CUDA_CHECK(cudaEventRecord(a, stream));
    run();
    CSATTN_CUDA_CHECK(cudaEventRecord(b, stream));
    CSATTN_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0.0f;
    CSATTN_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    v.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace csattn::cuda
