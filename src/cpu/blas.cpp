#include "cpu/blas.hpp"

#include <cblas.h>

namespace csattn::cpu {

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
          int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (batch_invariant()) {
    gemm_batch_invariant(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  if (K <= 0) {  // BLAS leaves C untouched for K = 0 only when beta = 1
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) C[static_cast<long>(i) * ldc + j] *= beta;
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C,
              ldc);
}

void linear(const float* X, int rows, int in, const float* W, int out, float* Y) {
  gemm(false, true, rows, out, in, 1.0f, X, in, W, in, 0.0f, Y, out);
}

void linear_grad_input(const float* dY, int rows, int out, const float* W, int in, float* dX,
                       bool accumulate) {
  gemm(false, false, rows, in, out, 1.0f, dY, out, W, in, accumulate ? 1.0f : 0.0f, dX, in);
}

void linear_grad_weight(const float* dY, int rows, int out, const float* X, int in, float* dW,
                        bool accumulate) {
  gemm(true, false, out, in, rows, 1.0f, dY, out, X, in, accumulate ? 1.0f : 0.0f, dW, in);
}

}  // namespace csattn::cpu
