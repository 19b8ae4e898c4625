// The MPI communicator: non-blocking MPI calls behind CommRequest handles.
#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <mutex>
#include <string>

#include "csattn/comm.hpp"
#include "csattn/error.hpp"

namespace csattn {

namespace {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(ErrorKind::Internal, std::string(what) + " failed: " + std::string(text, len));
}

MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    default: return MPI_DATATYPE_NULL;
  }
}

// MPI counts are int: element counts above INT_MAX are refused with a clear message.
int mpi_count(std::size_t n, const char* what) {
  require(n <= static_cast<std::size_t>(INT_MAX), ErrorKind::Unsupported,
          std::string(what) + ": " + std::to_string(n) + " elements exceed MPI's int count");
  return static_cast<int>(n);
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_SUM;
}

class MpiRequest : public CommRequest::Impl {
 public:
  explicit MpiRequest(std::vector<MPI_Request> reqs) : reqs_(std::move(reqs)) {}
  void wait() override {
    if (reqs_.empty()) return;
    check_mpi(MPI_Waitall(static_cast<int>(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE),
              "MPI_Waitall");
  }

 private:
  std::vector<MPI_Request> reqs_;
};

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void ensure_initialized() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;  // the embedding program owns MPI
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided),
              "MPI_Init_thread");
    std::atexit(finalize_at_exit);
  });
}

class MpiComm : public Communicator {
 public:
  MpiComm() {
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // Errors come back as return codes, reported as csattn::Error.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

 protected:
  CommRequest post_exchange(const std::vector<P2PMessage>& sends,
                            const std::vector<P2PMessage>& receives, CommStream) override {
    std::vector<MPI_Request> reqs;
    reqs.reserve(sends.size() + receives.size());
    for (const P2PMessage& m : receives) {
      reqs.emplace_back();
      check_mpi(MPI_Irecv(m.buffer.data, mpi_count(m.buffer.bytes(), "exchange"), MPI_BYTE,
                          m.peer, kTag, comm_, &reqs.back()),
                "MPI_Irecv");
    }
    for (const P2PMessage& m : sends) {
      reqs.emplace_back();
      check_mpi(MPI_Isend(m.buffer.data, mpi_count(m.buffer.bytes(), "exchange"), MPI_BYTE,
                          m.peer, kTag, comm_, &reqs.back()),
                "MPI_Isend");
    }
    return CommRequest(std::make_unique<MpiRequest>(std::move(reqs)));
  }
  CommRequest post_all_gather(CommBuffer in, CommBuffer out, CommStream) override {
    std::vector<MPI_Request> reqs(1);
    check_mpi(MPI_Iallgather(in.data, mpi_count(in.bytes(), "all_gather"), MPI_BYTE, out.data,
                             mpi_count(in.bytes(), "all_gather"), MPI_BYTE, comm_, &reqs[0]),
              "MPI_Iallgather");
    return CommRequest(std::make_unique<MpiRequest>(std::move(reqs)));
  }
  CommRequest post_reduce_scatter_sum(CommBuffer in, CommBuffer out, CommStream) override {
    const MPI_Datatype t = mpi_type(in.dtype);
    require(t != MPI_DATATYPE_NULL, ErrorKind::Unsupported,
            std::string("reduce_scatter_sum on ") + dtype_name(in.dtype));
    std::vector<MPI_Request> reqs(1);
    check_mpi(MPI_Ireduce_scatter_block(in.data, out.data,
                                        mpi_count(out.count, "reduce_scatter_sum"), t, MPI_SUM,
                                        comm_, &reqs[0]),
              "MPI_Ireduce_scatter_block");
    return CommRequest(std::make_unique<MpiRequest>(std::move(reqs)));
  }
  CommRequest post_all_reduce(CommBuffer inout, ReduceOp op, CommStream) override {
    const MPI_Datatype t = mpi_type(inout.dtype);
    require(t != MPI_DATATYPE_NULL, ErrorKind::Unsupported,
            std::string("all_reduce on ") + dtype_name(inout.dtype));
    std::vector<MPI_Request> reqs(1);
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, inout.data, mpi_count(inout.count, "all_reduce"), t,
                             mpi_op(op), comm_, &reqs[0]),
              "MPI_Iallreduce");
    return CommRequest(std::make_unique<MpiRequest>(std::move(reqs)));
  }
  void do_barrier() override { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }

 private:
  static constexpr int kTag = 4242;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

}  // namespace

bool mpi_available() { return true; }

std::unique_ptr<Communicator> mpi_world() {
  ensure_initialized();
  return std::make_unique<MpiComm>();
}

}  // namespace csattn
