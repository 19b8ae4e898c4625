// `csattn comm-check`: checks a communicator the way context parallelism uses it and times
// it. Every rank runs all-gather, reduce-scatter, all-reduce (sum and max) and a ring
// exchange on host or device buffers filled with a pattern whose result is known exactly,
// verifies every element, and rank 0 prints per operation the result over all ranks, the
// median time and the bus bandwidth (nccl-tests' convention: the bytes a ring algorithm moves
// per rank). Backends: threads in this process (`local`), MPI ranks (`mpi`, under mpirun),
// NCCL (`nccl`: one GPU per rank, bootstrapped through MPI under mpirun or through threads
// in this process). Exit status 0 when every check passed, 1 when one failed, 2 for bad
// options or an unavailable backend.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#ifdef CSATTN_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "cli_util.hpp"
#include "commands.hpp"
#include "csattn/comm.hpp"
#include "csattn/error.hpp"

namespace csattn::cli {

namespace {

struct CommCheckArgs {
  std::string backend = "auto";
  std::string device = "cpu";
  int ranks = 0;  // in-process ranks; 0: 2 for local, one per GPU for nccl
  double mib = 16.0;
  int iters = 5;
};

// A buffer of n elements of T on the host or the device.
template <class T>
class Buffer {
 public:
  Buffer(std::size_t n, Device dev) : n_(n), dev_(dev) {
    if (dev_ == Device::cpu) {
      host_.resize(n);
      return;
    }
#ifdef CSATTN_HAVE_CUDA
    check(cudaMalloc(&dev_ptr_, sizeof(T) * std::max<std::size_t>(n, 1)), "cudaMalloc");
#else
    throw Error(ErrorKind::Unsupported, "--device cuda: this build has no CUDA backend");
#endif
  }
  ~Buffer() {
#ifdef CSATTN_HAVE_CUDA
    if (dev_ptr_) cudaFree(dev_ptr_);
#endif
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  CommBuffer comm(DType dt) { return CommBuffer{data(), n_, dt, dev_}; }
  void* data() { return dev_ == Device::cpu ? static_cast<void*>(host_.data()) : dev_ptr_; }
  void set(const std::vector<T>& v) {
    if (dev_ == Device::cpu) {
      host_ = v;
      return;
    }
#ifdef CSATTN_HAVE_CUDA
    check(cudaMemcpy(dev_ptr_, v.data(), sizeof(T) * n_, cudaMemcpyHostToDevice), "upload");
    check(cudaDeviceSynchronize(), "upload");
#endif
  }
  std::vector<T> get() const {
    if (dev_ == Device::cpu) return host_;
    std::vector<T> v(n_);
#ifdef CSATTN_HAVE_CUDA
    check(cudaMemcpy(v.data(), dev_ptr_, sizeof(T) * n_, cudaMemcpyDeviceToHost), "download");
#endif
    return v;
  }

 private:
#ifdef CSATTN_HAVE_CUDA
  static void check(cudaError_t rc, const char* what) {
    if (rc != cudaSuccess) throw Error(ErrorKind::Internal, std::string(what) + ": " + cudaGetErrorString(rc));
  }
#endif
  std::size_t n_;
  Device dev_;
  std::vector<T> host_;
  void* dev_ptr_ = nullptr;
};

struct OpResult {
  std::string name;
  double bytes = 0.0;     // per rank, the operation's size
  double bus_factor = 0;  // bus bytes = bytes * factor
  double ms = 0.0;        // median
  bool ok = true;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Patterns with exact results in f32: small integers.
float pattern(int rank, std::size_t i) { return static_cast<float>(static_cast<int>((i * 7 + 3) % 1021) + rank); }

std::vector<OpResult> check_all(Communicator& comm, Device dev, std::size_t n, int iters) {
  const int P = comm.size(), r = comm.rank();
  std::vector<OpResult> out;
  // prepare() resets the inputs (in-place operations), outside the timed span.
  auto timed = [&](OpResult res, auto&& prepare, auto&& run_once, auto&& verify) {
    std::vector<double> ms;
    for (int it = 0; it < iters + 1; ++it) {  // the first run is a warm-up
      prepare();
      comm.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      run_once();
      const auto t1 = std::chrono::steady_clock::now();
      if (it > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      res.ok = res.ok && verify();
    }
    res.ms = median(ms);
    out.push_back(res);
  };
  const std::size_t block = std::max<std::size_t>(n / static_cast<std::size_t>(P), 1);
  const double pf = static_cast<double>(P);
  {  // all-gather: n elements out, block in
    Buffer<float> in(block, dev), gathered(block * static_cast<std::size_t>(P), dev);
    std::vector<float> mine(block);
    for (std::size_t i = 0; i < block; ++i) mine[i] = pattern(r, i);
    in.set(mine);
    timed({"all_gather", 4.0 * block * pf, (pf - 1) / pf}, [] {},
          [&] { comm.all_gather(in.comm(DType::f32), gathered.comm(DType::f32)).wait(); },
          [&] {
            const std::vector<float> got = gathered.get();
            for (int s = 0; s < P; ++s)
              for (std::size_t i = 0; i < block; ++i)
                if (got[static_cast<std::size_t>(s) * block + i] != pattern(s, i)) return false;
            return true;
          });
  }
  {  // reduce-scatter: block * P in, block out
    Buffer<float> in(block * static_cast<std::size_t>(P), dev), reduced(block, dev);
    std::vector<float> mine(block * static_cast<std::size_t>(P));
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = pattern(r, i);
    in.set(mine);
    timed({"reduce_scatter", 4.0 * block * pf, (pf - 1) / pf}, [] {},
          [&] { comm.reduce_scatter_sum(in.comm(DType::f32), reduced.comm(DType::f32)).wait(); },
          [&] {
            const std::vector<float> got = reduced.get();
            for (std::size_t i = 0; i < block; ++i) {
              float want = 0.0f;
              for (int s = 0; s < P; ++s) want += pattern(s, static_cast<std::size_t>(r) * block + i);
              if (got[i] != want) return false;
            }
            return true;
          });
  }
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {  // all-reduce in place: reset each run
    Buffer<float> buf(n, dev);
    std::vector<float> mine(n);
    for (std::size_t i = 0; i < n; ++i) mine[i] = pattern(r, i);
    timed({op == ReduceOp::sum ? "all_reduce_sum" : "all_reduce_max", 4.0 * n, 2 * (pf - 1) / pf},
          [&] { buf.set(mine); }, [&] { comm.all_reduce(buf.comm(DType::f32), op).wait(); },
          [&] {
            const std::vector<float> got = buf.get();
            for (std::size_t i = 0; i < n; ++i) {
              const float want = op == ReduceOp::sum ? P * pattern(0, i) + static_cast<float>(P * (P - 1) / 2)
                                                     : pattern(P - 1, i);
              if (got[i] != want) return false;
            }
            return true;
          });
  }
  if (P > 1) {  // ring exchange: send to the next rank, receive from the previous
    Buffer<float> send(block, dev), recv(block, dev);
    std::vector<float> mine(block);
    for (std::size_t i = 0; i < block; ++i) mine[i] = pattern(r, i);
    send.set(mine);
    const int next = (r + 1) % P, prev = (r + P - 1) % P;
    timed({"ring_exchange", 4.0 * block, 1.0}, [] {},
          [&] { comm.exchange({{next, send.comm(DType::f32)}}, {{prev, recv.comm(DType::f32)}}).wait(); },
          [&] {
            const std::vector<float> got = recv.get();
            for (std::size_t i = 0; i < block; ++i)
              if (got[i] != pattern(prev, i)) return false;
            return true;
          });
  }
  // Every rank's verdicts, combined over all ranks (max of "failed" flags). NCCL takes device
  // buffers only, so there the verdict travels through a device copy.
  std::vector<std::int32_t> failed(out.size());
  for (std::size_t k = 0; k < out.size(); ++k) failed[k] = out[k].ok ? 0 : 1;
  if (comm.accepts(Device::cpu)) {
    comm.all_reduce(comm_buffer(failed.data(), failed.size()), ReduceOp::max).wait();
  } else {
    Buffer<std::int32_t> d(failed.size(), Device::cuda);
    d.set(failed);
    comm.all_reduce(d.comm(DType::i32), ReduceOp::max).wait();
    failed = d.get();
  }
  for (std::size_t k = 0; k < out.size(); ++k) out[k].ok = failed[k] == 0;
  return out;
}

int report(const Communicator& comm, const std::string& backend, Device dev, std::size_t n,
           const std::vector<OpResult>& results) {
  if (comm.rank() == 0) {
    fmt::print("comm-check: backend {}, {} ranks, {} buffers, {:.1f} MiB per rank\n", backend, comm.size(),
               dev == Device::cuda ? "device" : "host", 4.0 * static_cast<double>(n) / (1 << 20));
    fmt::print("{:<16} {:>10} {:>10} {:>12}  {}\n", "operation", "MiB", "ms", "busbw GB/s", "result");
    for (const OpResult& r : results) {
      const double busbw = r.ms > 0 ? r.bytes * r.bus_factor / (r.ms * 1e-3) / 1e9 : 0.0;
      fmt::print("{:<16} {:>10.2f} {:>10.3f} {:>12.2f}  {}\n", r.name, r.bytes / (1 << 20), r.ms, busbw,
                 r.ok ? "ok" : "WRONG");
    }
  }
  bool ok = true;
  for (const OpResult& r : results) ok = ok && r.ok;
  return ok ? 0 : 1;
}


int run_comm_check(const CommCheckArgs& a) {
  require(a.backend == "auto" || a.backend == "local" || a.backend == "mpi" || a.backend == "nccl",
          ErrorKind::InvalidArgument, "--backend: '" + a.backend + "' (expected auto, local, mpi or nccl)");
  require(a.device == "cpu" || a.device == "cuda", ErrorKind::InvalidArgument,
          "--device: '" + a.device + "' (expected cpu or cuda)");
  require(a.mib > 0.0 && a.mib <= 4096.0, ErrorKind::InvalidArgument,
          fmt::format("--mib: {:g} (expected a size in (0, 4096])", a.mib));
  require(a.iters >= 1 && a.iters <= 1000, ErrorKind::InvalidArgument,
          "--iters: " + std::to_string(a.iters) + " (expected 1 to 1000)");
  require(a.ranks >= 0 && a.ranks <= 64, ErrorKind::InvalidArgument,
          "--ranks: " + std::to_string(a.ranks) + " (expected 1 to 64)");
  const std::string backend = a.backend == "auto" ? (mpi_launched() ? "mpi" : "local") : a.backend;
  const bool nccl = backend == "nccl";
  const Device dev = nccl || a.device == "cuda" ? Device::cuda : Device::cpu;
  require(!nccl || nccl_available(), ErrorKind::Unsupported, "--backend nccl: this build has no NCCL");
  const int gpus = dev == Device::cuda ? visible_gpus() : 0;
  require(dev == Device::cpu || gpus > 0, ErrorKind::Unsupported,
          std::string(nccl ? "--backend nccl" : "--device cuda") + ": no GPU is visible");
  require(backend != "mpi" || mpi_available(), ErrorKind::Unsupported, "--backend mpi: this build has no MPI");
  const std::size_t n = static_cast<std::size_t>(a.mib * (1 << 20) / 4.0);

  auto check_on = [&](Communicator& host_comm) {
    if (!nccl) {
#ifdef CSATTN_HAVE_CUDA
      if (dev == Device::cuda && cudaSetDevice(0) != cudaSuccess)
        throw Error(ErrorKind::Internal, "cudaSetDevice(0) failed");
#endif
      return report(host_comm, backend, dev, n, check_all(host_comm, dev, n, a.iters));
    }
    // One GPU per rank: the launcher's node-local rank where it says (several nodes), else
    // this communicator's rank, modulo the visible GPUs.
    const int local = launcher_local_rank() >= 0 && mpi_launched() ? launcher_local_rank() : host_comm.rank();
    std::unique_ptr<Communicator> c = nccl_communicator(host_comm, local % gpus);
    return report(*c, "nccl", dev, n, check_all(*c, dev, n, a.iters));
  };

  if (backend == "mpi" || (nccl && mpi_launched())) {
    std::unique_ptr<Communicator> world = mpi_world();
    return check_on(*world);
  }
  const int ranks = a.ranks > 0 ? a.ranks : nccl ? gpus : 2;
  require(!nccl || ranks <= gpus, ErrorKind::InvalidArgument,
          "--ranks " + std::to_string(ranks) + " with --backend nccl needs as many GPUs; " + std::to_string(gpus) +
              " visible (NCCL takes one GPU per rank)");
  int status = 0;
  std::mutex mu;
  run_local_ranks(ranks, [&](Communicator& comm) {
    const int s = check_on(comm);
    std::lock_guard<std::mutex> lock(mu);
    status = std::max(status, s);
  });
  return status;
}

}  // namespace

Command add_comm_check_command(CLI::App& app) {
  auto a = std::make_shared<CommCheckArgs>();
  CLI::App* cmd = app.add_subcommand(
      "comm-check",
      "Check and time the communicator context parallelism uses: all-gather, reduce-scatter, "
      "all-reduce and a ring exchange, every element verified (run it under mpirun for MPI or "
      "NCCL across processes)");
  cmd->add_option("--backend", a->backend, "auto (mpi under mpirun, else local), local, mpi or nccl")
      ->capture_default_str();
  cmd->add_option("--device", a->device, "Buffers on the cpu or on the cuda device (nccl: always cuda)")
      ->capture_default_str();
  cmd->add_option("--ranks", a->ranks, "In-process ranks (local: default 2; nccl: one per GPU)");
  cmd->add_option("--mib", a->mib, "MiB per rank and operation")->capture_default_str();
  cmd->add_option("--iters", a->iters, "Timed runs per operation (the median is reported)")->capture_default_str();
  return [a]() { return run_comm_check(*a); };
}

}  // namespace csattn::cli
