#include "csattn/build_info.hpp"

#include <omp.h>

#include <nlohmann/json.hpp>
#include <string>

#include "csattn/comm.hpp"
#include "csattn/layer.hpp"
#ifdef CSATTN_HAVE_CUDA
#include "cuda/device_info.hpp"
#endif

#ifndef CSATTN_VERSION
#error "CSATTN_VERSION comes from CMake (the project version)"
#endif

namespace csattn {

std::string version() { return CSATTN_VERSION; }

BuildInfo build_info() {
  BuildInfo b;
  b.version = version();
  b.nccl = nccl_available();
  b.mpi = mpi_available();
#ifdef CSATTN_HAVE_CBLAS
  b.cblas = true;
#endif
  b.cpu_threads = omp_get_max_threads();
  // The layer's own check says why there is no GPU (no backend, no device, a driver too old).
  std::string why;
  [[maybe_unused]] const bool gpu = cuda_available(&why);
#ifdef CSATTN_HAVE_CUDA
  b.cuda_backend = true;
  if (gpu) cuda::describe_devices(b);
  else cuda::describe_backend(b);
#endif
  if (b.gpus.empty()) b.gpu_note = why.empty() ? "no CUDA device could be queried" : why;
  return b;
}

std::string to_json(const BuildInfo& b) {
  nlohmann::json gpus = nlohmann::json::array();
  for (const GpuInfo& g : b.gpus)
    gpus.push_back({{"index", g.index},
                    {"name", g.name},
                    {"compute_capability", std::to_string(g.major) + "." + std::to_string(g.minor)},
                    {"multiprocessors", g.multiprocessors},
                    {"memory_bytes", g.memory_bytes},
                    {"smem_per_block_optin", g.smem_per_block_optin},
                    {"runs_kernels", g.runs_kernels}});
  const nlohmann::json j = {{"version", b.version},
                            {"cuda_backend", b.cuda_backend},
                            {"cuda_target", b.cuda_target},
                            {"cuda_runtime_version", b.cuda_runtime_version},
                            {"cuda_driver_version", b.cuda_driver_version},
                            {"nccl", b.nccl},
                            {"mpi", b.mpi},
                            {"cblas", b.cblas},
                            {"cpu_threads", b.cpu_threads},
                            {"gpus", gpus},
                            {"gpu_note", b.gpu_note}};
  return j.dump(2);
}

}  // namespace csattn
