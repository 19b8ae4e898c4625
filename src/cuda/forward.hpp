// The forward of one layer on the GPU: a fixed sequence of kernel launches on one stream.
// No allocation and no host synchronisation: every buffer is in ForwardParams.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <vector>

#include "cuda/check.hpp"
#include "cuda/kernels.hpp"
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

// ---- the stages run_forward runs in order (cuBLAS already on `stream`, with p's scratch);
// the context-parallel layer (cp_layer.cpp) runs them with its collectives in between ----

enum class Compressor { main, indexer };

// Q path (cq, q) and the shared K=V head over all of p's rows.
void forward_projections(const ForwardParams& p, cublasHandle_t blas, cudaStream_t stream);
// One compressor: its projections over p's rows (c_a / c_g, or i_a / i_g), then pooling,
// RMSNorm, RoPE (and Hadamard for the indexer's) into the compressed rows that (cd, cm)
// describe - p's own (one GPU), or a context-parallel rank's owned slots - through `pooled`
// into `out`.
void forward_compressor(const ForwardParams& p, Compressor which, const LayerDims& cd,
                        const DeviceMetadata& cm, bf16* pooled, bf16* out, cublasHandle_t blas,
                        cudaStream_t stream);
// The indexer's queries (qi: RoPE, Hadamard) and head weights (w_eff).
void forward_indexer_queries(const ForwardParams& p, cublasHandle_t blas, cudaStream_t stream);
// The top-k selection from qi, w_eff and i_keys (through MXFP8 first with that precision).
void forward_selection(const ForwardParams& p, cudaStream_t stream);
// Whether the selection also writes the selected ids' scores into the sparse loss's kept
// logits (act.loss_kept), which the forward's loss launch then takes as its predictor logits
// instead of recomputing them (CSA forward at 64K tokens 84.4 -> 79.5 ms on an H100, perf.md
// fifteenth session): where the loss
// keeps values, the selection runs (no forced top-k) and on a wgmma indexer (the two-
// warpgroup or the overlapped kernel), the ones that write them. The selection and the loss launch both ask, so they agree.
bool loss_logits_from_selection(const ForwardParams& p);
// Sparse attention (attn, lse), then the inverse RoPE and the output projections (y).
// forward_output rotates attn in place: it runs once after each forward_attention (a second
// run would rotate attn again and keep rotated tails).
void forward_attention(const ForwardParams& p, cudaStream_t stream);
void forward_output(const ForwardParams& p, cublasHandle_t blas, cudaStream_t stream);
// RoPE alone on `rows` token rows of width n (per_token a token), in place, with the given
// sign: launch_norm_rope's tail kernel (forward_output's inverse RoPE, the backward's RoPE^T).
NormRopeArgs rope_rows_args(const ForwardParams& f, bf16* v, int rows, int n, int per_token, int sign);
// O as the attention backward reads it after forward_output: attn's heads with the tails
// forward_output kept (params.hpp, OutputRows).
OutputRows attention_output(const ForwardParams& p);

}  // namespace csattn::cuda
