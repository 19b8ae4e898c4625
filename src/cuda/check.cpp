#include "cuda/check.hpp"

#include <mutex>
#include <set>
#include <utility>

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

namespace {

struct SmemLimits {
  std::size_t optin = 0;         // static + dynamic per block (227 KB on Hopper)
  std::size_t static_bytes = 0;  // the kernel's own __shared__ variables
};

SmemLimits smem_limits(const void* kernel, int device) {
  int optin = 0;
  CSATTN_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes attr{};
  CSATTN_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  return {static_cast<std::size_t>(optin), attr.sharedSizeBytes};
}

}  // namespace

std::size_t dynamic_smem_limit(const void* kernel) {
  int device = 0;
  CSATTN_CUDA_CHECK(cudaGetDevice(&device));
  const SmemLimits l = smem_limits(kernel, device);
  return l.optin - l.static_bytes;
}

void allow_dynamic_smem(const void* kernel, std::size_t bytes, const char* what) {
  static std::mutex mutex;
  static std::set<std::pair<int, const void*>> raised;  // (device, kernel)
  int device = 0;
  CSATTN_CUDA_CHECK(cudaGetDevice(&device));
  // Static and dynamic shared memory together may not exceed the opt-in maximum.
  const SmemLimits l = smem_limits(kernel, device);
  const std::size_t dynamic_max = l.optin - l.static_bytes;
  require(bytes <= dynamic_max, ErrorKind::Unsupported,
          std::string(what) + " needs " + std::to_string(bytes) +
              " bytes of dynamic shared memory per block; this device allows " +
              std::to_string(dynamic_max));
  if (bytes + l.static_bytes <= 48 * 1024) return;  // the default limit suffices
  std::lock_guard<std::mutex> lock(mutex);
  if (raised.insert({device, kernel}).second)
    CSATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(dynamic_max)));
}

int multiprocessor_count() {
  int device = 0, count = 0;
  CSATTN_CUDA_CHECK(cudaGetDevice(&device));
  CSATTN_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

}  // namespace csattn::cuda
