#include "cuda/gemm.hpp"

#include "cuda/check.hpp"

namespace csattn::cuda {

void use_blas(cublasHandle_t h, cudaStream_t stream, void* workspace, std::size_t bytes) {
  CSATTN_CUBLAS_CHECK(cublasSetStream(h, stream));
  if (workspace) CSATTN_CUBLAS_CHECK(cublasSetWorkspace(h, workspace, bytes));
}

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

void linear_grad_input(cublasHandle_t h, const bf16* dY, int rows, int out, const bf16* W, int in,
                       bf16* dX) {
  if (rows <= 0 || in <= 0) return;
  const float one = 1.0f, zero = 0.0f;
  CSATTN_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, in, rows, out, &one, W,
                                   CUDA_R_16BF, in, dY, CUDA_R_16BF, out, &zero, dX, CUDA_R_16BF,
                                   in, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void linear_grad_input_f32(cublasHandle_t h, const bf16* dY, int rows, int out, const bf16* W,
                           int in, float* dX, bool accumulate) {
  if (rows <= 0 || in <= 0) return;
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  CSATTN_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, in, rows, out, &one, W,
                                   CUDA_R_16BF, in, dY, CUDA_R_16BF, out, &beta, dX, CUDA_R_32F,
                                   in, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void linear_grad_weight(cublasHandle_t h, const bf16* dY, int rows, int out, const bf16* X, int in,
                        float* dW) {
  if (rows <= 0 || out <= 0) return;
  const float one = 1.0f;
  // Column-major dW^T [in, out] = X^T [in, rows] (dY^T [out, rows])^T.
  CSATTN_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, in, out, rows, &one, X,
                                   CUDA_R_16BF, in, dY, CUDA_R_16BF, out, &one, dW, CUDA_R_32F,
                                   in, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void grouped_linear_grad_input(cublasHandle_t h, const bf16* dU, int rows, int groups,
                               int group_dim, const bf16* W, int rank, bf16* dO) {
  if (rows <= 0) return;
  const float one = 1.0f, zero = 0.0f;
  CSATTN_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      h, CUBLAS_OP_N, CUBLAS_OP_N, group_dim, rows, rank, &one, W, CUDA_R_16BF, group_dim,
      static_cast<long long>(rank) * group_dim, dU, CUDA_R_16BF, groups * rank, rank, &zero, dO,
      CUDA_R_16BF, groups * group_dim, group_dim, groups, CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
}

void grouped_linear_grad_weight(cublasHandle_t h, const bf16* dU, int rows, int groups,
                                int group_dim, const bf16* O, int rank, float* dW) {
  if (rows <= 0) return;
  const float one = 1.0f;
  CSATTN_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      h, CUBLAS_OP_N, CUBLAS_OP_T, group_dim, rank, rows, &one, O, CUDA_R_16BF,
      groups * group_dim, group_dim, dU, CUDA_R_16BF, groups * rank, rank, &one, dW, CUDA_R_32F,
      group_dim, static_cast<long long>(rank) * group_dim, groups, CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
}

}  // namespace csattn::cuda
