#include "cpu/blas.hpp"

#include <algorithm>
#include <vector>

#ifdef CSATTN_HAVE_CBLAS
#include <cblas.h>
#endif

namespace csattn::cpu {

namespace {

#ifndef CSATTN_HAVE_CBLAS
// Fallback when no BLAS package exists (the lent GPU machine): a cache-blocked row-major
// GEMM. op(A) is copied to a row-major [M, K] panel and op(B) to a [K, N] panel so the inner
// loop runs over contiguous memory; rows of C are split across threads only when the caller
// is not already inside a parallel region.
void fallback_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                   const float* A, int lda, const float* B, int ldb, float beta, float* C,
                   int ldc) {
  std::vector<float> bp(static_cast<std::size_t>(K) * N);
  for (int k = 0; k < K; ++k)
    for (int j = 0; j < N; ++j)
      bp[static_cast<std::size_t>(k) * N + j] =
          trans_b ? B[static_cast<long>(j) * ldb + k] : B[static_cast<long>(k) * ldb + j];
#pragma omp parallel for schedule(static) if (M > 64)
  for (int i = 0; i < M; ++i) {
    std::vector<float> acc(static_cast<std::size_t>(N), 0.0f);
    for (int k = 0; k < K; ++k) {
      const float a = trans_a ? A[static_cast<long>(k) * lda + i] : A[static_cast<long>(i) * lda + k];
      const float* brow = bp.data() + static_cast<std::size_t>(k) * N;
      for (int j = 0; j < N; ++j) acc[j] += a * brow[j];
    }
    float* c = C + static_cast<long>(i) * ldc;
    for (int j = 0; j < N; ++j) c[j] = alpha * acc[j] + (beta == 0.0f ? 0.0f : beta * c[j]);
  }
}
#endif

}  // namespace

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
          int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (batch_invariant()) {
    gemm_batch_invariant(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  if (K <= 0) {  // BLAS leaves C untouched for K = 0 only when beta = 1
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        float& c = C[static_cast<long>(i) * ldc + j];
        c = beta == 0.0f ? 0.0f : beta * c;
      }
    return;
  }
#ifdef CSATTN_HAVE_CBLAS
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C,
              ldc);
#else
  fallback_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
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
