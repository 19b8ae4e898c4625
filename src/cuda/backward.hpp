// The backward of one layer on the GPU: a fixed sequence of launches on one stream, reading
// the forward's activations (ForwardParams) and writing gradients (no allocation, no sync).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "csattn/config.hpp"
#include "cuda/backward_params.hpp"
#include "cuda/forward.hpp"
#include "cuda/params.hpp"

namespace csattn::cuda {

struct BackwardParams {
  BackwardBuffers buf;
  DeviceGradients grad;  // zeroed by the caller
  float grad_loss = 1.0f;   // upstream gradient of the indexer loss (its scale: f.meta.loss_scale)
  const float* grad_loss_on_device = nullptr;  // if set: the upstream gradient, read on the device
  bool sparse_loss = true;
  // Fixed-order reductions instead of atomics (bitwise-repeatable gradients).
  bool deterministic = false;
};

// With a timer, events between the stages ("output projections", "attention", "q path",
// "kv path", "compressor", "indexer loss", "indexer q path", "indexer compressor"; bench
// only).
void run_backward(const ForwardParams& f, const BackwardParams& b, cublasHandle_t blas,
                  cudaStream_t stream, StageTimer* timer = nullptr);

// The backward cases the GPU refuses (csattn::Error with the reason), checked before any
// launch by every layer that runs the stages below.
void check_backward_supported(const AttentionConfig& c, const ForwardParams& f, bool deterministic,
                              float grad_indexer_loss);

// ---- the stages run_backward runs in order (cuBLAS on `stream`); the context-parallel
// layer (cp_layer.cpp) runs them with its collectives in between ----

// Output projections and the inverse RoPE's transpose: dy -> dattn (+ wo_a, wo_b grads).
void backward_output(const ForwardParams& f, const BackwardParams& p, cublasHandle_t blas,
                     cudaStream_t stream);
// Attention: dq (bf16), dkv_acc (zeroed here), dcomp_acc (zeroed here) and the sink gradient.
// With st: marks "attention" after the attention backward and, where the deterministic HCA
// backward runs its key-stationary compressed-row pass (launch_comp_grad_keyed), "attention
// keyed rows" after that.
void backward_attention(const ForwardParams& f, const BackwardParams& p, cudaStream_t stream,
                        Stages* st = nullptr);
// The query path back to x: dx = (its gradient) - overwrites dx. Runs after
// backward_attention, and before anything else writes dx: its dqb lives in dattn's bytes, dx
// in dq's (plan_backward).
void backward_query_path(const ForwardParams& f, const BackwardParams& p, cublasHandle_t blas,
                         cudaStream_t stream);
// The K=V path back to x: dx += .
void backward_kv_path(const ForwardParams& f, const BackwardParams& p, cublasHandle_t blas,
                      cudaStream_t stream);
// One compressor, from the fp32 gradient of its compressed rows (dout_acc, laid out as
// (cd, cm) describe: f's own rows, or a context-parallel rank's owned slots) to its weights
// and, for the main compressor, dx += .
void backward_compressor(const ForwardParams& f, const BackwardParams& p, Compressor which,
                         const LayerDims& cd, const DeviceMetadata& cm, const float* dout_acc,
                         cublasHandle_t blas, cudaStream_t stream);
// The indexer loss's gradients: dqi, dweff and dkeys_acc (zeroed here; f's compressed rows).
void backward_indexer_loss(const ForwardParams& f, const BackwardParams& p, cudaStream_t stream);
// The indexer queries' weight gradients (i_wq_b, i_wproj) from dqi and dweff.
void backward_indexer_queries(const ForwardParams& f, const BackwardParams& p,
                              cublasHandle_t blas, cudaStream_t stream);
// Whether the indexer's backward runs at all (CSA, a nonzero loss gradient).
bool indexer_loss_backward_runs(const ForwardParams& f, const BackwardParams& p);

// The indexer loss value (forward): into f.act.loss_rows and f.act.loss[0].
void run_indexer_loss(const ForwardParams& f, const BackwardParams& b, cudaStream_t stream);

// True when the sparse loss's predictor is the MXFP8 selection's softmax (MXFP8 indexer, the
// indexer's own selection): the loss kernels then take the MXFP8 operands (qi_proj,
// i_keys_mx) as their predictor operands (IndexerLossArgs::pred_qi / pred_keys).
bool mxfp8_predictor(const ForwardParams& f, const BackwardParams& b);

}  // namespace csattn::cuda
