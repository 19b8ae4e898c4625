#include "cuda/check.hpp"

#include <map>
#include <mutex>
#include <set>
#include <tuple>
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
  std::size_t dynamic_max = 0;   // the opt-in maximum per block less the static bytes
  std::size_t static_bytes = 0;  // the kernel's own __shared__ variables
};

// Per (device, kernel), asked of the runtime once: the support checks and the launches ask on
// every layer call.
SmemLimits smem_limits(const void* kernel, int device) {
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, SmemLimits> known;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find({device, kernel});
  if (it != known.end()) return it->second;
  int optin = 0;
  CSATTN_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes attr{};
  CSATTN_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  const SmemLimits l{static_cast<std::size_t>(optin) - attr.sharedSizeBytes, attr.sharedSizeBytes};
  known.emplace(std::make_pair(device, kernel), l);
  return l;
}

int current_device() {
  int device = 0;
  CSATTN_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

}  // namespace

std::size_t dynamic_smem_limit(const void* kernel) {
  return smem_limits(kernel, current_device()).dynamic_max;
}

void allow_dynamic_smem(const void* kernel, std::size_t bytes, const char* what) {
  static std::mutex mutex;
  static std::set<std::pair<int, const void*>> raised;  // (device, kernel)
  const int device = current_device();
  // Static and dynamic shared memory together may not exceed the opt-in maximum.
  const SmemLimits l = smem_limits(kernel, device);
  require(bytes <= l.dynamic_max, ErrorKind::Unsupported,
          std::string(what) + " needs " + std::to_string(bytes) +
              " bytes of dynamic shared memory per block; this device allows " +
              std::to_string(l.dynamic_max));
  if (bytes + l.static_bytes <= 48 * 1024) return;  // the default limit suffices
  std::lock_guard<std::mutex> lock(mutex);
  if (raised.count({device, kernel})) return;
  // Recorded only once raised: a failed call throws here and the next launch tries again.
  CSATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(l.dynamic_max)));
  raised.insert({device, kernel});
}

int max_active_clusters(const void* kernel, const cudaLaunchConfig_t& config) {
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, std::size_t>, int> known;  // (device, kernel, smem)
  const int device = current_device();
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device, kernel, config.dynamicSmemBytes);
  auto it = known.find(key);
  if (it != known.end()) return it->second;
  int n = 0;
  CSATTN_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &config));
  known.emplace(key, n);
  return n;
}

int multiprocessor_count() {
  int count = 0;
  CSATTN_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, current_device()));
  return count;
}

}  // namespace csattn::cuda
