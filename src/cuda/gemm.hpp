// Projections through cuBLAS: bf16 operands, fp32 accumulation, bf16 output. Row-major
// tensors with weights [out, in] as in the checkpoints.
#pragma once
#include <cublas_v2.h>

#include "cuda/params.hpp"

namespace csattn::cuda {

// Y[rows, out] = X[rows, in] W[out, in]^T
void linear(cublasHandle_t h, const bf16* X, int rows, int in, const bf16* W, int out, bf16* Y);

// Grouped low-rank O: U[t, g*r_o + r] = sum_d W[g*r_o + r, d] O[t, g*gd + d] for G groups.
void grouped_linear(cublasHandle_t h, const bf16* O, int rows, int groups, int group_dim,
                    const bf16* W, int rank, bf16* U);

}  // namespace csattn::cuda
