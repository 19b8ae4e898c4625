// Projections through cuBLAS: bf16 operands, fp32 accumulation, bf16 output. Row-major
// tensors with weights [out, in] as in the checkpoints.
#pragma once
#include <cublas_v2.h>

#include <cstddef>

#include "cuda/params.hpp"

namespace csattn::cuda {

// Binds the handle to `stream` and, where given, to the caller's scratch (after the stream:
// cublasSetStream resets cuBLAS to its own pool). With a scratch cuBLAS allocates nothing
// inside a run (CUDA-graph capture).
void use_blas(cublasHandle_t h, cudaStream_t stream, void* workspace, std::size_t bytes);

// Y[rows, out] = X[rows, in] W[out, in]^T
void linear(cublasHandle_t h, const bf16* X, int rows, int in, const bf16* W, int out, bf16* Y);

// Grouped low-rank O: U[t, g*r_o + r] = sum_d W[g*r_o + r, d] O[t, g*gd + d] for G groups.
void grouped_linear(cublasHandle_t h, const bf16* O, int rows, int groups, int group_dim,
                    const bf16* W, int rank, bf16* U);

// Backward. dX[rows, in] (+)= dY[rows, out] W[out, in]; dX is bf16 (beta 0 only) or fp32.
void linear_grad_input(cublasHandle_t h, const bf16* dY, int rows, int out, const bf16* W, int in,
                       bf16* dX);
void linear_grad_input_f32(cublasHandle_t h, const bf16* dY, int rows, int out, const bf16* W,
                           int in, float* dX, bool accumulate);
// dW[out, in] += dY[rows, out]^T X[rows, in] (fp32 accumulation buffer).
void linear_grad_weight(cublasHandle_t h, const bf16* dY, int rows, int out, const bf16* X, int in,
                        float* dW);
// Grouped O: dO[t, g*gd + d] = sum_r dU[t, g*r_o + r] W[g*r_o + r, d];
// dW[g*r_o + r, d] += sum_t dU[t, g*r_o + r] O[t, g*gd + d].
void grouped_linear_grad_input(cublasHandle_t h, const bf16* dU, int rows, int groups,
                               int group_dim, const bf16* W, int rank, bf16* dO);
void grouped_linear_grad_weight(cublasHandle_t h, const bf16* dU, int rows, int groups,
                                int group_dim, const bf16* O, int rank, float* dW);

}  // namespace csattn::cuda
