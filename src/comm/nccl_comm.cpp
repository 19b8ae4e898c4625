// The NCCL communicator: device buffers, the caller's stream, NCCL's own ordering.
//
// Every operation is enqueued on the given stream (null: the legacy default stream) and
// returns at once; its request records a CUDA event after it, and wait() blocks the host on
// that event. Work enqueued later on the same stream is ordered after the operation anyway,
// so stream-ordered callers (the CUDA context-parallel layer, graph capture) never need to
// wait; while the stream is being captured wait() does nothing (a capture cannot sync).
// An exchange is one ncclGroupStart/End of all its sends and receives; collectives map one
// to one. NVLink multicast (NVLS) is switched off before the first communicator is made
// (NCCL_NVLS_ENABLE=0 unless the environment already says otherwise), as the lent machines
// require.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "csattn/comm.hpp"
#include "csattn/error.hpp"

namespace csattn {

namespace {

void check_cuda(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return;
  throw Error(ErrorKind::Internal, std::string(what) + " failed: " + cudaGetErrorString(rc));
}

void check_nccl(ncclResult_t rc, const char* what, ncclComm_t comm = nullptr) {
  if (rc == ncclSuccess) return;
  std::string msg = std::string(what) + " failed: " + ncclGetErrorString(rc);
  const char* last = comm ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  if (last && *last) msg += std::string(" (") + last + ")";
  throw Error(ErrorKind::Internal, msg);
}

ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::e4m3:
    case DType::e8m0: return ncclUint8;  // moved as bytes, never reduced
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

void require_reducible(DType dt, const char* what) {
  require(dt != DType::e4m3 && dt != DType::e8m0, ErrorKind::Unsupported,
          std::string(what) + ": " + dtype_name(dt) + " cannot be reduced");
}

// Completion of one enqueued operation: an event recorded after it on its stream.
class StreamRequest : public CommRequest::Impl {
 public:
  explicit StreamRequest(cudaStream_t stream) : stream_(stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    check_cuda(cudaStreamIsCapturing(stream_, &status), "cudaStreamIsCapturing");
    capturing_ = status != cudaStreamCaptureStatusNone;
    if (!capturing_) {
      check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
      check_cuda(cudaEventRecord(event_, stream_), "cudaEventRecord");
    }
  }
  ~StreamRequest() override {
    if (event_) cudaEventDestroy(event_);
  }
  void wait() override {
    if (capturing_ || !event_) return;
    check_cuda(cudaEventSynchronize(event_), "waiting for an NCCL operation");
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t event_ = nullptr;
  bool capturing_ = false;
};

class NcclComm final : public Communicator {
 public:
  NcclComm(ncclComm_t comm, int rank, int size, int device)
      : comm_(comm), rank_(rank), size_(size), device_(device) {}
  ~NcclComm() override {
    cudaSetDevice(device_);
    if (comm_) ncclCommDestroy(comm_);
    if (scratch_) cudaFree(scratch_);
    if (host_scratch_) cudaFree(host_scratch_);
    if (host_stream_) cudaStreamDestroy(host_stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  bool accepts(Device device) const override { return device == Device::cuda; }
  int device() const override { return device_; }

 protected:
  CommRequest post_exchange(const std::vector<P2PMessage>& sends,
                            const std::vector<P2PMessage>& receives, CommStream s) override {
    const cudaStream_t stream = use(s);
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    // Both lists go into one group, so their order cannot deadlock; between two ranks NCCL
    // matches sends and receives in posting order, as the interface promises.
    for (const P2PMessage& m : sends)
      check_nccl(ncclSend(m.buffer.data, m.buffer.count, nccl_type(m.buffer.dtype), m.peer, comm_, stream),
                 "ncclSend", comm_);
    for (const P2PMessage& m : receives)
      check_nccl(ncclRecv(m.buffer.data, m.buffer.count, nccl_type(m.buffer.dtype), m.peer, comm_, stream),
                 "ncclRecv", comm_);
    check_nccl(ncclGroupEnd(), "ncclGroupEnd (exchange)", comm_);
    return done(stream);
  }
  CommRequest post_all_gather(CommBuffer in, CommBuffer out, CommStream s) override {
    const cudaStream_t stream = use(s);
    check_nccl(ncclAllGather(in.data, out.data, in.count, nccl_type(in.dtype), comm_, stream),
               "ncclAllGather", comm_);
    return done(stream);
  }
  CommRequest post_reduce_scatter_sum(CommBuffer in, CommBuffer out, CommStream s) override {
    require_reducible(in.dtype, "reduce_scatter_sum");
    const cudaStream_t stream = use(s);
    check_nccl(ncclReduceScatter(in.data, out.data, out.count, nccl_type(in.dtype), ncclSum, comm_, stream),
               "ncclReduceScatter", comm_);
    return done(stream);
  }
  CommRequest post_all_reduce(CommBuffer inout, ReduceOp op, CommStream s) override {
    require_reducible(inout.dtype, "all_reduce");
    const cudaStream_t stream = use(s);
    check_nccl(ncclAllReduce(inout.data, inout.data, inout.count, nccl_type(inout.dtype), nccl_op(op), comm_,
                             stream),
               "ncclAllReduce", comm_);
    return done(stream);
  }
  // Host metadata through a grow-only device scratch on a private stream: only that stream
  // is synchronised (no cudaMalloc / cudaFree per call, which would wait for the whole
  // device, NCCL kernels included).
  void do_all_gather_host(const std::int64_t* in, std::size_t count, std::int64_t* out) override {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    const std::size_t total = count * static_cast<std::size_t>(size_);
    const std::size_t bytes = sizeof(std::int64_t) * (count + total);
    if (!host_stream_) check_cuda(cudaStreamCreateWithFlags(&host_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    if (bytes > host_scratch_bytes_) {
      check_cuda(cudaStreamSynchronize(host_stream_), "all_gather_host");
      if (host_scratch_) check_cuda(cudaFree(host_scratch_), "cudaFree");
      host_scratch_ = nullptr;
      host_scratch_bytes_ = 0;
      check_cuda(cudaMalloc(&host_scratch_, bytes), "cudaMalloc (all_gather_host)");
      host_scratch_bytes_ = bytes;
    }
    auto* dev = static_cast<std::int64_t*>(host_scratch_);
    check_cuda(cudaMemcpyAsync(dev, in, sizeof(std::int64_t) * count, cudaMemcpyHostToDevice, host_stream_),
               "all_gather_host upload");
    check_nccl(ncclAllGather(dev, dev + count, count, ncclInt64, comm_, host_stream_), "ncclAllGather (host)", comm_);
    check_cuda(cudaMemcpyAsync(out, dev + count, sizeof(std::int64_t) * total, cudaMemcpyDeviceToHost, host_stream_),
               "all_gather_host download");
    check_cuda(cudaStreamSynchronize(host_stream_), "all_gather_host");
  }
  void do_barrier() override {
    // A one-element all-reduce on the default stream, waited for: every rank has reached
    // it once it completes anywhere.
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    if (!scratch_) check_cuda(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc (barrier)");
    check_nccl(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, nullptr), "ncclAllReduce (barrier)",
               comm_);
    check_cuda(cudaStreamSynchronize(nullptr), "barrier");
  }

 private:
  // NCCL enqueues on the device of the communicator: make it current for this thread.
  cudaStream_t use(CommStream s) {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    return static_cast<cudaStream_t>(s);
  }
  static CommRequest done(cudaStream_t stream) {
    return CommRequest(std::make_unique<StreamRequest>(stream));
  }

  ncclComm_t comm_;
  int rank_, size_, device_;
  void* scratch_ = nullptr;
  void* host_scratch_ = nullptr;  // all_gather_host's staging (grow-only)
  std::size_t host_scratch_bytes_ = 0;
  cudaStream_t host_stream_ = nullptr;
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<Communicator> nccl_communicator(Communicator& bootstrap, int device) {
  int devices = 0;
  check_cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  require(device >= 0 && device < devices, ErrorKind::InvalidArgument,
          "nccl_communicator: device " + std::to_string(device) + " of " + std::to_string(devices) +
              " visible GPUs");
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  // Rank 0's unique id reaches every rank through the host communicator's all-gather
  // (MPI across nodes, threads in one process).
  constexpr std::size_t kWords = (sizeof(ncclUniqueId) + 3) / 4;
  std::int32_t mine[kWords] = {};
  if (bootstrap.rank() == 0) {
    ncclUniqueId id;
    check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    std::memcpy(mine, &id, sizeof id);
  }
  std::vector<std::int32_t> all(kWords * static_cast<std::size_t>(bootstrap.size()));
  bootstrap.all_gather(comm_buffer(mine, kWords), comm_buffer(all.data(), all.size())).wait();
  ncclUniqueId id;
  std::memcpy(&id, all.data(), sizeof id);
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()), "ncclCommInitRank");
  return std::make_unique<NcclComm>(comm, bootstrap.rank(), bootstrap.size(), device);
}

}  // namespace csattn
