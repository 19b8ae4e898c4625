// The backend-independent half of Communicator: argument checks and the byte counters.
#include "csattn/comm.hpp"

#include <cstdlib>
#include <string>

#include "csattn/error.hpp"

namespace csattn {

CommBuffer comm_buffer(float* p, std::size_t n) { return {p, n, DType::f32, Device::cpu}; }
CommBuffer comm_buffer(double* p, std::size_t n) { return {p, n, DType::f64, Device::cpu}; }
CommBuffer comm_buffer(std::int32_t* p, std::size_t n) { return {p, n, DType::i32, Device::cpu}; }
CommBuffer comm_buffer(std::int64_t* p, std::size_t n) { return {p, n, DType::i64, Device::cpu}; }

CommRequest& CommRequest::operator=(CommRequest&& other) noexcept {
  if (this != &other) {
    if (impl_) {
      try {
        impl_->wait();
      } catch (...) {
      }
    }
    impl_ = std::move(other.impl_);
  }
  return *this;
}

CommRequest::~CommRequest() {
  if (impl_) {
    try {
      impl_->wait();
    } catch (...) {
      // A destructor cannot report; the operation's failure was or will be seen elsewhere
      // (an aborted group fails every rank's next call).
    }
  }
}

void CommRequest::wait() {
  if (!impl_) return;
  std::unique_ptr<Impl> impl = std::move(impl_);
  impl->wait();
}

void Communicator::check_buffer(const CommBuffer& b, const char* what) const {
  require(accepts(b.device), ErrorKind::Unsupported,
          std::string(what) + ": the " + backend() + " communicator cannot use " +
              (b.device == Device::cuda ? "cuda" : "cpu") + " buffers");
  require(b.data != nullptr || b.count == 0, ErrorKind::InvalidArgument,
          std::string(what) + ": null buffer with " + std::to_string(b.count) + " elements");
}

CommRequest Communicator::exchange(const std::vector<P2PMessage>& sends,
                                   const std::vector<P2PMessage>& receives, CommStream stream) {
  for (const P2PMessage& m : sends) {
    check_buffer(m.buffer, "exchange send");
    require(m.peer >= 0 && m.peer < size() && m.peer != rank(), ErrorKind::InvalidArgument,
            "exchange: send to rank " + std::to_string(m.peer) + " from rank " +
                std::to_string(rank()) + " of " + std::to_string(size()));
    stats_.bytes_sent += m.buffer.bytes();
  }
  for (const P2PMessage& m : receives) {
    check_buffer(m.buffer, "exchange receive");
    require(m.peer >= 0 && m.peer < size() && m.peer != rank(), ErrorKind::InvalidArgument,
            "exchange: receive from rank " + std::to_string(m.peer) + " on rank " +
                std::to_string(rank()) + " of " + std::to_string(size()));
    stats_.bytes_received += m.buffer.bytes();
  }
  ++stats_.operations;
  return post_exchange(sends, receives, stream);
}

CommRequest Communicator::all_gather(CommBuffer in, CommBuffer out, CommStream stream) {
  check_buffer(in, "all_gather");
  check_buffer(out, "all_gather");
  require(in.dtype == out.dtype && out.count == in.count * static_cast<std::size_t>(size()),
          ErrorKind::ShapeMismatch,
          "all_gather: output holds " + std::to_string(out.count) + " " +
              dtype_name(out.dtype) + ", expected " + std::to_string(size()) + " x " +
              std::to_string(in.count) + " " + dtype_name(in.dtype));
  const std::uint64_t peers = static_cast<std::uint64_t>(size() - 1);
  stats_.bytes_sent += in.bytes() * peers;
  stats_.bytes_received += in.bytes() * peers;
  ++stats_.operations;
  return post_all_gather(in, out, stream);
}

CommRequest Communicator::reduce_scatter_sum(CommBuffer in, CommBuffer out, CommStream stream) {
  check_buffer(in, "reduce_scatter_sum");
  check_buffer(out, "reduce_scatter_sum");
  require(in.dtype == out.dtype && in.count == out.count * static_cast<std::size_t>(size()),
          ErrorKind::ShapeMismatch,
          "reduce_scatter_sum: input holds " + std::to_string(in.count) + " " +
              dtype_name(in.dtype) + ", expected " + std::to_string(size()) + " x " +
              std::to_string(out.count) + " " + dtype_name(out.dtype));
  const std::uint64_t peers = static_cast<std::uint64_t>(size() - 1);
  stats_.bytes_sent += out.bytes() * peers;
  stats_.bytes_received += out.bytes() * peers;
  ++stats_.operations;
  return post_reduce_scatter_sum(in, out, stream);
}

CommRequest Communicator::all_reduce(CommBuffer inout, ReduceOp op, CommStream stream) {
  check_buffer(inout, "all_reduce");
  const std::uint64_t moved =
      size() > 1 ? 2 * inout.bytes() * static_cast<std::uint64_t>(size() - 1) / size() : 0;
  stats_.bytes_sent += moved;
  stats_.bytes_received += moved;
  ++stats_.operations;
  return post_all_reduce(inout, op, stream);
}

void Communicator::barrier() {
  ++stats_.operations;
  do_barrier();
}

void Communicator::all_gather_host(const std::int64_t* in, std::size_t count, std::int64_t* out) {
  ++stats_.operations;
  const std::uint64_t bytes = sizeof(std::int64_t) * count * static_cast<std::uint64_t>(size() - 1);
  stats_.bytes_sent += bytes;
  stats_.bytes_received += bytes;
  do_all_gather_host(in, count, out);
}

void Communicator::do_all_gather_host(const std::int64_t* in, std::size_t count, std::int64_t* out) {
  require(accepts(Device::cpu), ErrorKind::Internal,
          "all_gather_host: the " + backend() + " communicator takes no host buffers and does not stage them");
  const std::size_t total = count * static_cast<std::size_t>(size());
  post_all_gather(comm_buffer(const_cast<std::int64_t*>(in), count), comm_buffer(out, total), nullptr).wait();
}

bool mpi_launched() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE",
                           "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS"}) {
    const char* v = std::getenv(name);
    if (v && std::atoi(v) > 1) return true;
  }
  return false;
}

int launcher_local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK",
                           "PMI_LOCAL_RANK", "SLURM_LOCALID"}) {
    const char* v = std::getenv(name);
    if (v && *v) {
      char* end = nullptr;
      const long r = std::strtol(v, &end, 10);
      if (end && *end == '\0' && r >= 0 && r < 1 << 20) return static_cast<int>(r);
    }
  }
  return -1;
}

}  // namespace csattn
