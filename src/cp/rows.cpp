// Moving tensors between the global row order and the ranks' local row orders.
#include <cstring>

#include "csattn/cp.hpp"
#include "csattn/error.hpp"

namespace csattn {

namespace {

std::size_t row_bytes(const Tensor& t) {
  std::size_t n = dtype_size(t.dtype());
  for (int i = 1; i < t.ndim(); ++i) n *= static_cast<std::size_t>(t.dim(i));
  return n;
}

Shape with_rows(const Tensor& t, std::int64_t rows) {
  Shape s = t.shape();
  s[0] = rows;
  return s;
}

}  // namespace

Tensor local_rows_of(const Tensor& global, const CpPartition& part, int rank) {
  require(global.ndim() >= 1 && global.dim(0) == part.total_rows(), ErrorKind::ShapeMismatch,
          "tensor has shape " + shape_str(global.shape()) + ", expected " +
              std::to_string(part.total_rows()) + " rows (the global batch)");
  Tensor out(global.dtype(), with_rows(global, part.local_rows(rank)));
  const std::size_t rb = row_bytes(global);
  auto* dst = static_cast<unsigned char*>(out.data());
  const auto* src = static_cast<const unsigned char*>(global.data());
  std::size_t i = 0;
  for (const RowPiece& piece : part.pieces(rank)) {
    std::memcpy(dst + i * rb, src + static_cast<std::size_t>(piece.begin) * rb,
                static_cast<std::size_t>(piece.size()) * rb);
    i += static_cast<std::size_t>(piece.size());
  }
  return out;
}

Tensor gather_rows(Communicator& comm, const CpPartition& part, const Tensor& local, int root) {
  const int P = comm.size(), rank = comm.rank();
  require(local.dtype() == DType::f32 || local.dtype() == DType::i32, ErrorKind::DTypeMismatch,
          std::string("gather_rows takes f32 or i32 tensors, got ") + dtype_name(local.dtype()));
  require(local.ndim() >= 1 && local.dim(0) == part.local_rows(rank), ErrorKind::ShapeMismatch,
          "gather_rows: rank " + std::to_string(rank) + "'s tensor has shape " +
              shape_str(local.shape()) + ", expected " + std::to_string(part.local_rows(rank)) +
              " rows");
  const std::size_t rb = row_bytes(local);
  const std::size_t elems_per_row = rb / dtype_size(local.dtype());
  auto buffer = [&](void* p, std::int64_t rows) {
    return CommBuffer{p, static_cast<std::size_t>(rows) * elems_per_row, local.dtype(),
                      Device::cpu};
  };
  if (rank != root) {
    comm.exchange({{root, buffer(const_cast<void*>(local.data()), local.dim(0))}}, {}).wait();
    return Tensor();
  }
  std::vector<Tensor> parts(static_cast<std::size_t>(P));
  std::vector<P2PMessage> recvs;
  for (int r = 0; r < P; ++r) {
    if (r == root) continue;
    parts[static_cast<std::size_t>(r)] = Tensor(local.dtype(), with_rows(local, part.local_rows(r)));
    recvs.push_back({r, buffer(parts[static_cast<std::size_t>(r)].data(), part.local_rows(r))});
  }
  comm.exchange({}, recvs).wait();
  Tensor out(local.dtype(), with_rows(local, part.total_rows()));
  auto* dst = static_cast<unsigned char*>(out.data());
  for (int r = 0; r < P; ++r) {
    const Tensor& t = r == root ? local : parts[static_cast<std::size_t>(r)];
    const auto* src = static_cast<const unsigned char*>(t.data());
    std::size_t i = 0;
    for (const RowPiece& piece : part.pieces(r)) {
      std::memcpy(dst + static_cast<std::size_t>(piece.begin) * rb, src + i * rb,
                  static_cast<std::size_t>(piece.size()) * rb);
      i += static_cast<std::size_t>(piece.size());
    }
  }
  return out;
}

void all_reduce_sum(Communicator& comm, std::map<std::string, Tensor>& tensors) {
  std::size_t total = 0;
  for (const auto& [name, t] : tensors) {
    require(t.dtype() == DType::f32, ErrorKind::DTypeMismatch,
            "all_reduce_sum: " + name + " is " + dtype_name(t.dtype()) + ", expected f32");
    total += static_cast<std::size_t>(t.numel());
  }
  std::vector<float> flat(total);
  std::size_t off = 0;
  for (const auto& [name, t] : tensors) {
    std::memcpy(flat.data() + off, t.data(), t.nbytes());
    off += static_cast<std::size_t>(t.numel());
  }
  comm.all_reduce(comm_buffer(flat.data(), flat.size()), ReduceOp::sum).wait();
  off = 0;
  for (auto& [name, t] : tensors) {
    std::memcpy(t.data(), flat.data() + off, t.nbytes());
    off += static_cast<std::size_t>(t.numel());
  }
}

}  // namespace csattn
