// What this build of csattn holds and what it can see: version, compiled backends and
// communicators, and the visible GPUs. `csattn info` prints it (`--json` for bug reports and
// scripts); Python: csattn.build_info().
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace csattn {

struct GpuInfo {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;       // compute capability
  int multiprocessors = 0;
  std::size_t memory_bytes = 0;
  std::size_t smem_per_block_optin = 0;  // opt-in shared memory per block
  bool runs_kernels = false;      // compute capability 9.0: the kernels are built for sm_90a only
};

struct BuildInfo {
  std::string version;            // the project version (CMake)
  bool cuda_backend = false;      // the CUDA backend is compiled in
  std::string cuda_target;        // its one target architecture ("sm_90a"), empty without it
  int cuda_runtime_version = 0;   // CUDART_VERSION compiled against (13000 = 13.0), 0 without it
  int cuda_driver_version = 0;    // the installed driver's CUDA version, 0 when unknown
  bool nccl = false;              // the NCCL communicator is compiled in
  bool mpi = false;               // the MPI communicator is compiled in
  bool cblas = false;             // CPU projections through a CBLAS (else the built-in GEMM)
  int cpu_threads = 0;            // OpenMP threads a CPU layer uses by default
  std::vector<GpuInfo> gpus;      // visible devices (empty without the backend or a device)
  std::string gpu_note;           // why there are none, when there are none
};

// Queries the devices (initialises the CUDA driver where the backend is built).
BuildInfo build_info();
// The version alone, without touching any device.
std::string version();
// One JSON object with the fields above (gpus as a list of objects): what `csattn info --json`
// prints and Python's csattn.build_info() parses.
std::string to_json(const BuildInfo& b);

}  // namespace csattn
