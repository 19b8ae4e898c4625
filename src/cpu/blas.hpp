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

// Batch invariance (docs/numerics.md). OpenBLAS is deterministic for identical calls, but a
// row's result changes with M and even with the row's position inside the call. While a
// BatchInvariantScope(true) lives on a thread, gemm() and the linear helpers on that thread
// use gemm_batch_invariant instead: every element of C is one fp32 sum over k in index order
// (a separate multiply and add per term, no FMA), so it depends only on its own row of op(A)
// and column of op(B), never on M, N, its position or the thread count. The forward of the
// fp32 mode runs this way, which is what lets context-parallel ranks reproduce the
// single-rank forward bit for bit. Operators that open OpenMP regions pass the setting on to
// their worker threads (see BatchInvariantScope below).
bool batch_invariant();
class BatchInvariantScope {
 public:
  explicit BatchInvariantScope(bool on);
  ~BatchInvariantScope();
  BatchInvariantScope(const BatchInvariantScope&) = delete;
  BatchInvariantScope& operator=(const BatchInvariantScope&) = delete;

 private:
  bool saved_;
};

// The batch-invariant product itself: C = alpha * op(A) op(B) + beta * C with the element
// rule above (beta = 0 ignores C, as BLAS does).
void gemm_batch_invariant(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                          const float* A, int lda, const float* B, int ldb, float beta,
                          float* C, int ldc);

}  // namespace csattn::cpu
