#include "cuda/gemm.hpp"

#include "cuda/check.hpp"

namespace csattn::cuda {

// cuBLAS is column-major: a row-major [r, c] matrix is a column-major [c, r] one. So the
// row-major Y = X W^T is the column-major Y^T = W X^T with W read transposed.
void linear(cublasHandle_t h, const bf16* X, int rows, int in, const bf16* W, int out, bf16* Y) {
  if (rows <= 0 || out <= 0) return;
  const float one = 1.0f, zero = 0.0f;
  CSATTN_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &one, W,
                                   CUDA_R_16BF, in, X, CUDA_R_16BF, in, &zero, Y, CUDA_R_16BF,
                                   out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void grouped_linear(cublasHandle_t h, const bf16* O, int rows, int groups, int group_dim,
                    const bf16* W, int rank, bf16* U) {
  if (rows <= 0) return;
  const float one = 1.0f, zero = 0.0f;
  // Group g: U_g^T [rank, rows] (ld G*rank) = W_g [rank, gd] (col-major gd x rank, read
  // transposed) times O_g^T [gd, rows] (ld H*D).
  CSATTN_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      h, CUBLAS_OP_T, CUBLAS_OP_N, rank, rows, group_dim, &one, W, CUDA_R_16BF, group_dim,
      static_cast<long long>(rank) * group_dim, O, CUDA_R_16BF, groups * group_dim, group_dim,
      &zero, U, CUDA_R_16BF, groups * rank, rank, groups, CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
}

}  // namespace csattn::cuda
