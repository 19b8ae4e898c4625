// Thin CBLAS (OpenBLAS) wrappers for the projections. Row-major everywhere; a weight W is
// [out, in] as in the release checkpoints, so a linear layer is Y = X W^T.
#pragma once

namespace csattn::cpu {

// C[M,N] = alpha * op(A) op(B) + beta * C, row-major with explicit leading dimensions.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
          int lda, const float* B, int ldb, float beta, float* C, int ldc);

// Y[rows, out] = X[rows, in] W[out, in]^T
void linear(const float* X, int rows, int in, const float* W, int out, float* Y);
// dX[rows, in] (+)= dY[rows, out] W[out, in]
void linear_grad_input(const float* dY, int rows, int out, const float* W, int in, float* dX,
                       bool accumulate);
// dW[out, in] (+)= dY[rows, out]^T X[rows, in]
void linear_grad_weight(const float* dY, int rows, int out, const float* X, int in, float* dW,
                        bool accumulate);

}  // namespace csattn::cpu
