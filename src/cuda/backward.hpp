// The backward of one layer on the GPU: a fixed sequence of launches on one stream, reading
// the forward's activations (ForwardParams) and writing gradients (no allocation, no sync).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "cuda/backward_params.hpp"
#include "cuda/forward.hpp"
#include "cuda/params.hpp"

namespace csattn::cuda {

struct BackwardParams {
  BackwardBuffers buf;
  DeviceGradients grad;  // zeroed by the caller
  float grad_loss = 1.0f;   // upstream gradient of the indexer loss
  float loss_scale = 0.0f;  // lambda / N_real_rows, or lambda per token
  bool sparse_loss = true;
  // Fixed-order reductions instead of atomics (bitwise-repeatable gradients).
  bool deterministic = false;
};

// With a timer, events between the stages ("output projections", "attention", "q path",
// "kv path", "compressor", "indexer loss", "indexer q path", "indexer compressor"; bench
// only).
void run_backward(const ForwardParams& f, const BackwardParams& b, cublasHandle_t blas,
                  cudaStream_t stream, StageTimer* timer = nullptr);

// The indexer loss value (forward): into f.act.loss_rows and f.act.loss[0].
void run_indexer_loss(const ForwardParams& f, const BackwardParams& b, cudaStream_t stream);

// True when the sparse loss's predictor is the MXFP8 selection's softmax (MXFP8 indexer, the
// indexer's own selection): the loss kernels then take the MXFP8 operands (qi_proj,
// i_keys_mx) as their predictor operands (IndexerLossArgs::pred_qi / pred_keys).
bool mxfp8_predictor(const ForwardParams& f, const BackwardParams& b);

}  // namespace csattn::cuda
