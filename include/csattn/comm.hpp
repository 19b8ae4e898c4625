// Communicator: the point-to-point and collective operations context parallelism needs, with
// non-blocking handles. Backends: an in-process group (one thread per rank, for tests and
// single-process runs), MPI (ranks launched by mpirun) and NCCL (device buffers on the
// caller's stream, bootstrapped through either). Buffers carry their dtype and device and
// every operation takes an optional stream; `accepts(device)` says which buffers a backend
// takes.
//
// Rules every backend keeps:
// - Collectives are matched by call order: every rank issues the same collectives in the
//   same order (the CP layer guarantees it by deciding every collective from metadata the
//   ranks have agreed on). A rank may post several operations before waiting on them.
// - Buffers handed to an operation must stay valid and unmodified until its wait() returns.
// - Results never depend on timing: the in-process backend adds in rank order; MPI uses its
//   implementation's (deterministic for a fixed rank count) order.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "csattn/tensor.hpp"

namespace csattn {

// A typed buffer: `count` elements of `dtype` at `data` on `device`.
struct CommBuffer {
  void* data = nullptr;
  std::size_t count = 0;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  std::size_t bytes() const { return count * dtype_size(dtype); }
};

CommBuffer comm_buffer(float* p, std::size_t n);
CommBuffer comm_buffer(double* p, std::size_t n);
CommBuffer comm_buffer(std::int32_t* p, std::size_t n);
CommBuffer comm_buffer(std::int64_t* p, std::size_t n);

enum class ReduceOp { sum, max, min };

// An opaque stream handle (cudaStream_t for a device backend); host backends ignore it.
using CommStream = void*;

// The handle of a posted operation. wait() blocks until it is complete (and rethrows a
// failure as csattn::Error); a handle destroyed before wait() waits first.
class CommRequest {
 public:
  struct Impl {
    virtual ~Impl() = default;
    virtual void wait() = 0;
  };
  CommRequest() = default;
  explicit CommRequest(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  CommRequest(CommRequest&&) noexcept = default;
  CommRequest& operator=(CommRequest&& other) noexcept;
  ~CommRequest();
  void wait();
  bool pending() const { return impl_ != nullptr; }

 private:
  std::unique_ptr<Impl> impl_;
};

// One message of an exchange: to (sends) or from (receives) `peer`.
struct P2PMessage {
  int peer = 0;
  CommBuffer buffer;
};

// Payload bytes of this rank, counted the same way by every backend: what a direct
// algorithm moves. exchange: the messages; all_gather: this rank's block to and from each
// other rank; reduce_scatter: one output block to and from each other rank; all_reduce: a
// reduce-scatter plus an all-gather of the buffer.
struct CommStats {
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  std::uint64_t operations = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "local", "mpi", "nccl"
  virtual bool accepts(Device device) const { return device == Device::cpu; }
  // The CUDA device a device-only backend (NCCL) runs on; -1 for the others.
  virtual int device() const { return -1; }

  // Posts every send and receive of one exchange together (MPI Isend/Irecv, later
  // ncclGroupStart/End). Between two ranks, messages are matched in the order posted.
  CommRequest exchange(const std::vector<P2PMessage>& sends,
                       const std::vector<P2PMessage>& receives, CommStream stream = nullptr);
  // out.count = size() * in.count; block r of out is rank r's in (rank-major).
  CommRequest all_gather(CommBuffer in, CommBuffer out, CommStream stream = nullptr);
  // in.count = size() * out.count; out = the sum over ranks of block rank() of their in.
  CommRequest reduce_scatter_sum(CommBuffer in, CommBuffer out, CommStream stream = nullptr);
  // In place over every rank's buffer.
  CommRequest all_reduce(CommBuffer inout, ReduceOp op, CommStream stream = nullptr);
  void barrier();
  // A blocking all-gather of host memory (`count` values per rank, rank-major into `out`),
  // on every backend: a device-only one (NCCL) stages it through its own device scratch on a
  // private stream, without synchronising the device. For small metadata such as the
  // context-parallel layer's agreement, not for payloads.
  void all_gather_host(const std::int64_t* in, std::size_t count, std::int64_t* out);

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 protected:
  virtual CommRequest post_exchange(const std::vector<P2PMessage>& sends,
                                    const std::vector<P2PMessage>& receives,
                                    CommStream stream) = 0;
  virtual CommRequest post_all_gather(CommBuffer in, CommBuffer out, CommStream stream) = 0;
  virtual CommRequest post_reduce_scatter_sum(CommBuffer in, CommBuffer out,
                                              CommStream stream) = 0;
  virtual CommRequest post_all_reduce(CommBuffer inout, ReduceOp op, CommStream stream) = 0;
  virtual void do_barrier() = 0;
  // Default: the backend's all-gather on the host buffers (needs accepts(Device::cpu)).
  virtual void do_all_gather_host(const std::int64_t* in, std::size_t count, std::int64_t* out);

 private:
  void check_buffer(const CommBuffer& b, const char* what) const;
  CommStats stats_;
};

// ---- in-process backend ----

// `size` ranks inside one process; rank(r) is the communicator of rank r, to be used by one
// thread. abort() makes every blocked and every later operation of the group throw, so a
// failing rank cannot leave the others hanging.
class LocalCommGroup {
 public:
  explicit LocalCommGroup(int size);
  ~LocalCommGroup();
  LocalCommGroup(const LocalCommGroup&) = delete;
  LocalCommGroup& operator=(const LocalCommGroup&) = delete;
  int size() const;
  Communicator& rank(int r);
  void abort(const std::string& reason);

  struct State;

 private:
  std::shared_ptr<State> state_;
  std::vector<std::unique_ptr<Communicator>> ranks_;
};

// Runs fn(comm) on `size` threads, one per rank of a fresh LocalCommGroup. A rank that
// throws aborts the group (the others' pending and later operations throw instead of
// hanging); after every thread has finished, the exception of the rank that failed first
// is rethrown.
void run_local_ranks(int size, const std::function<void(Communicator&)>& fn);

// ---- NCCL backend ----

// This build has the NCCL backend (CUDA toolkit with libnccl).
bool nccl_available();
// A communicator over NCCL for the ranks of `bootstrap` (a host communicator: MPI across
// nodes, or an in-process group with one thread per GPU), this rank on GPU `device`.
// Collective: every rank of `bootstrap` calls it. Rank 0's NCCL unique id travels through
// bootstrap's all-gather. Buffers must be Device::cuda; operations are enqueued on the
// caller's stream, and wait() blocks the host until the operation is complete (a no-op
// while the stream is being captured: stream order is enough there). NVLink multicast is
// off (NCCL_NVLS_ENABLE=0 unless set). Throws csattn::Error(Unsupported) without NCCL.
std::unique_ptr<Communicator> nccl_communicator(Communicator& bootstrap, int device);

// ---- MPI backend ----

bool mpi_available();  // this build has the MPI backend
// True when the environment says this process is one of several ranks launched by mpirun
// (OMPI_COMM_WORLD_SIZE, PMI_SIZE, ... > 1): the CLI needs no extra flag.
bool mpi_launched();
// The communicator over MPI_COMM_WORLD (a duplicate). Initializes MPI on first use
// (MPI_THREAD_FUNNELED: only the calling thread talks to MPI) and finalizes it at exit.
// Throws csattn::Error(Unsupported) without MPI.
std::unique_ptr<Communicator> mpi_world();
// This process's rank among the ranks of its node, as the launcher reports it
// (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, MV2_COMM_WORLD_LOCAL_RANK, PMI_LOCAL_RANK,
// SLURM_LOCALID), or -1: the GPU a rank should take when every node runs one rank per GPU.
int launcher_local_rank();

}  // namespace csattn
