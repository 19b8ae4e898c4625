#include "cuda/check.hpp"

namespace csattn::cuda {

void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  throw Error(ErrorKind::Internal, std::string("CUDA error ") + cudaGetErrorName(err) + " (" +
                                       cudaGetErrorString(err) + ") in " + what + " at " +
                                       file + ":" + std::to_string(line));
}

void throw_cublas_error(cublasStatus_t st, const char* what, const char* file, int line) {
  throw Error(ErrorKind::Internal, std::string("cuBLAS error ") + cublasGetStatusName(st) +
                                       " in " + what + " at " + file + ":" +
                                       std::to_string(line));
}

}  // namespace csattn::cuda
