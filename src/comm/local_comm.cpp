// The in-process communicator: `size` ranks in one process, one thread each.
//
// Point-to-point sends are eager (copied into the receiver's mailbox when posted), so an
// exchange never blocks on a peer; receives take their messages in wait(). A collective is
// matched by its per-rank sequence number; the last rank to post it computes every rank's
// output (reductions add in rank order) and marks it done, so a rank's wait() never needs
// another rank to be waiting too. A group can be aborted: every blocked and later call then
// throws, which is how a failing rank releases the others.
//
// Device buffers (builds with CUDA): P ranks sharing one GPU in one process. A rank's
// device inputs are complete when it posts (its stream is synchronised first); data moves
// with cudaMemcpy (synchronous, so outputs are in place when the collective is marked
// done), and reductions stage device inputs on the host and add there in rank order - the
// same order and result as host buffers. Meant for testing the device code paths of
// context parallelism on one GPU, not for speed.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#ifdef CSATTN_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "csattn/comm.hpp"
#include "csattn/error.hpp"

namespace csattn {

namespace {

enum class CollKind { all_gather, reduce_scatter, all_reduce, barrier };

const char* kind_name(CollKind k) {
  switch (k) {
    case CollKind::all_gather: return "all_gather";
    case CollKind::reduce_scatter: return "reduce_scatter_sum";
    case CollKind::all_reduce: return "all_reduce";
    case CollKind::barrier: return "barrier";
  }
  return "?";
}

// Copies n bytes between any two buffers (host or device).
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t n) {
  if (n == 0) return;
  if (dst_dev == Device::cpu && src_dev == Device::cpu) {
    std::memcpy(dst, src, n);
    return;
  }
#ifdef CSATTN_HAVE_CUDA
  // A pageable host -> device cudaMemcpy may return before its DMA lands, and the ranks'
  // non-blocking streams are not ordered after the legacy stream it runs on: wait for it.
  cudaError_t rc = cudaMemcpy(dst, src, n, cudaMemcpyDefault);
  if (rc == cudaSuccess && dst_dev == Device::cuda) rc = cudaStreamSynchronize(cudaStreamLegacy);
  if (rc != cudaSuccess)
    throw Error(ErrorKind::Internal, std::string("local communicator: cudaMemcpy failed: ") + cudaGetErrorString(rc));
#else
  throw Error(ErrorKind::Unsupported, "local communicator: device buffers need a CUDA build");
#endif
}

// The stream-ordered work that produced a device input must be complete before another
// rank's thread reads it.
void sync_stream(CommStream stream) {
#ifdef CSATTN_HAVE_CUDA
  const cudaError_t rc = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  if (rc != cudaSuccess)
    throw Error(ErrorKind::Internal, std::string("local communicator: stream sync failed: ") + cudaGetErrorString(rc));
#else
  (void)stream;
#endif
}

template <class T>
T reduce_pair(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return a + b;
    case ReduceOp::max: return std::max(a, b);
    case ReduceOp::min: return std::min(a, b);
  }
  return a;
}

// dst[i] = in[0][off+i] op in[1][off+i] op ... in rank order.
template <class T>
void reduce_into(const std::vector<CommBuffer>& in, std::size_t off, std::size_t n, ReduceOp op,
                 void* dst_raw) {
  T* dst = static_cast<T*>(dst_raw);
  std::vector<T> acc(n);
  const T* first = static_cast<const T*>(in[0].data) + off;
  std::copy(first, first + n, acc.begin());
  for (std::size_t r = 1; r < in.size(); ++r) {
    const T* src = static_cast<const T*>(in[r].data) + off;
    for (std::size_t i = 0; i < n; ++i) acc[i] = reduce_pair(acc[i], src[i], op);
  }
  std::copy(acc.begin(), acc.end(), dst);
}

void reduce_typed(DType dt, const std::vector<CommBuffer>& in, std::size_t off, std::size_t n,
                  ReduceOp op, void* dst) {
  switch (dt) {
    case DType::f32: reduce_into<float>(in, off, n, op, dst); return;
    case DType::f64: reduce_into<double>(in, off, n, op, dst); return;
    case DType::i32: reduce_into<std::int32_t>(in, off, n, op, dst); return;
    case DType::i64: reduce_into<std::int64_t>(in, off, n, op, dst); return;
    default:
      throw Error(ErrorKind::Unsupported,
                  std::string("reductions support f32, f64, i32 and i64, not ") + dtype_name(dt));
  }
}

}  // namespace

struct LocalCommGroup::State {
  explicit State(int n) : size(n), next_seq(static_cast<std::size_t>(n), 0) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  bool aborted = false;
  std::string abort_reason;

  // Mailboxes: (from, to) -> messages in posting order.
  std::map<std::pair<int, int>, std::deque<std::vector<unsigned char>>> mail;

  struct Collective {
    CollKind kind = CollKind::barrier;
    DType dtype = DType::f32;
    std::size_t count = 0;  // per-rank input count
    ReduceOp op = ReduceOp::sum;
    int posted = 0, left = 0;
    bool done = false;
    std::string error;  // set when the ranks' calls do not match
    std::vector<CommBuffer> in, out;
  };
  std::map<std::uint64_t, Collective> collectives;
  std::vector<std::uint64_t> next_seq;

  void throw_if_aborted() const {
    if (aborted) throw Error(ErrorKind::Internal, abort_reason);
  }
};

namespace {

using State = LocalCommGroup::State;

class ExchangeRequest : public CommRequest::Impl {
 public:
  ExchangeRequest(std::shared_ptr<State> st, int rank, std::vector<P2PMessage> receives)
      : st_(std::move(st)), rank_(rank), receives_(std::move(receives)) {}
  void wait() override {
    std::unique_lock<std::mutex> lock(st_->mu);
    for (const P2PMessage& m : receives_) {
      auto& box = st_->mail[{m.peer, rank_}];
      st_->cv.wait(lock, [&] { return st_->aborted || !box.empty(); });
      st_->throw_if_aborted();
      std::vector<unsigned char> msg = std::move(box.front());
      box.pop_front();
      require(msg.size() == m.buffer.bytes(), ErrorKind::ShapeMismatch,
              "exchange: rank " + std::to_string(rank_) + " expected " +
                  std::to_string(m.buffer.bytes()) + " bytes from rank " +
                  std::to_string(m.peer) + " but the message has " +
                  std::to_string(msg.size()));
      copy_bytes(m.buffer.data, m.buffer.device, msg.data(), Device::cpu, msg.size());
    }
  }

 private:
  std::shared_ptr<State> st_;
  int rank_;
  std::vector<P2PMessage> receives_;
};

class CollectiveRequest : public CommRequest::Impl {
 public:
  CollectiveRequest(std::shared_ptr<State> st, std::uint64_t seq) : st_(std::move(st)), seq_(seq) {}
  void wait() override {
    std::unique_lock<std::mutex> lock(st_->mu);
    auto it = st_->collectives.find(seq_);
    State::Collective& c = it->second;
    st_->cv.wait(lock, [&] { return st_->aborted || c.done; });
    const std::string error = c.error;
    if (++c.left == st_->size) st_->collectives.erase(it);
    st_->throw_if_aborted();
    if (!error.empty()) throw Error(ErrorKind::InvalidArgument, error);
  }

 private:
  std::shared_ptr<State> st_;
  std::uint64_t seq_;
};

// Host views of the inputs of a reduction: device inputs copied to `staged`.
std::vector<CommBuffer> host_inputs(const std::vector<CommBuffer>& in,
                                    std::vector<std::vector<unsigned char>>& staged) {
  std::vector<CommBuffer> host = in;
  staged.resize(in.size());
  for (std::size_t r = 0; r < in.size(); ++r) {
    if (in[r].device == Device::cpu) continue;
    staged[r].resize(in[r].bytes());
    copy_bytes(staged[r].data(), Device::cpu, in[r].data, in[r].device, in[r].bytes());
    host[r].data = staged[r].data();
    host[r].device = Device::cpu;
  }
  return host;
}

// Runs a complete collective: every rank has posted. Called with the lock held.
void complete(State& st, State::Collective& c) {
  const int P = st.size;
  if (c.error.empty()) {
    try {
      const std::size_t esz = dtype_size(c.dtype);
      switch (c.kind) {
        case CollKind::barrier: break;
        case CollKind::all_gather:
          for (int r = 0; r < P; ++r)
            for (int src = 0; src < P; ++src)
              copy_bytes(static_cast<unsigned char*>(c.out[r].data) + src * c.count * esz, c.out[r].device,
                         c.in[src].data, c.in[src].device, c.count * esz);
          break;
        case CollKind::reduce_scatter: {
          const std::size_t block = c.count / static_cast<std::size_t>(P);
          std::vector<std::vector<unsigned char>> staged;
          const std::vector<CommBuffer> in = host_inputs(c.in, staged);
          std::vector<unsigned char> tmp(block * esz);
          for (int r = 0; r < P; ++r) {
            reduce_typed(c.dtype, in, static_cast<std::size_t>(r) * block, block, ReduceOp::sum, tmp.data());
            copy_bytes(c.out[r].data, c.out[r].device, tmp.data(), Device::cpu, tmp.size());
          }
          break;
        }
        case CollKind::all_reduce: {
          // Reduce into a temporary first: the inputs are also the outputs.
          std::vector<std::vector<unsigned char>> staged;
          const std::vector<CommBuffer> in = host_inputs(c.in, staged);
          std::vector<unsigned char> tmp(c.count * esz);
          reduce_typed(c.dtype, in, 0, c.count, c.op, tmp.data());
          for (int r = 0; r < P; ++r) copy_bytes(c.out[r].data, c.out[r].device, tmp.data(), Device::cpu, tmp.size());
          break;
        }
      }
    } catch (const Error& e) {  // every rank's wait() reports it
      c.error = e.what();
    }
  }
  c.done = true;
  st.cv.notify_all();
}

class LocalComm : public Communicator {
 public:
  LocalComm(std::shared_ptr<State> st, int rank) : st_(std::move(st)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return st_->size; }
  std::string backend() const override { return "local"; }
#ifdef CSATTN_HAVE_CUDA
  bool accepts(Device) const override { return true; }
#endif

 protected:
  CommRequest post_exchange(const std::vector<P2PMessage>& sends,
                            const std::vector<P2PMessage>& receives, CommStream stream) override {
    // Device buffers: the stream's earlier work is done before the host copies - a send's
    // data is ready, and a receive buffer is no longer read by earlier launches when wait()
    // overwrites it.
    bool device = false;
    for (const P2PMessage& m : sends) device |= m.buffer.device == Device::cuda;
    for (const P2PMessage& m : receives) device |= m.buffer.device == Device::cuda;
    if (device) sync_stream(stream);
    {
      // Device payloads are copied out before taking the lock.
      std::vector<std::vector<unsigned char>> payloads;
      for (const P2PMessage& m : sends) {
        if (m.buffer.device == Device::cpu) {
          const auto* p = static_cast<const unsigned char*>(m.buffer.data);
          payloads.emplace_back(p, p + m.buffer.bytes());
        } else {
          payloads.emplace_back(m.buffer.bytes());
          copy_bytes(payloads.back().data(), Device::cpu, m.buffer.data, m.buffer.device, m.buffer.bytes());
        }
      }
      std::lock_guard<std::mutex> lock(st_->mu);
      st_->throw_if_aborted();
      for (std::size_t i = 0; i < sends.size(); ++i)
        st_->mail[{rank_, sends[i].peer}].push_back(std::move(payloads[i]));
      st_->cv.notify_all();
    }
    return CommRequest(std::make_unique<ExchangeRequest>(st_, rank_, receives));
  }
  CommRequest post_all_gather(CommBuffer in, CommBuffer out, CommStream stream) override {
    if (in.device == Device::cuda || out.device == Device::cuda) sync_stream(stream);
    return post(CollKind::all_gather, in, out, ReduceOp::sum);
  }
  CommRequest post_reduce_scatter_sum(CommBuffer in, CommBuffer out, CommStream stream) override {
    if (in.device == Device::cuda || out.device == Device::cuda) sync_stream(stream);
    return post(CollKind::reduce_scatter, in, out, ReduceOp::sum);
  }
  CommRequest post_all_reduce(CommBuffer inout, ReduceOp op, CommStream stream) override {
    if (inout.device == Device::cuda) sync_stream(stream);
    return post(CollKind::all_reduce, inout, inout, op);
  }
  void do_barrier() override { post(CollKind::barrier, {}, {}, ReduceOp::sum).wait(); }

 private:
  CommRequest post(CollKind kind, CommBuffer in, CommBuffer out, ReduceOp op) {
    std::lock_guard<std::mutex> lock(st_->mu);
    st_->throw_if_aborted();
    const std::uint64_t seq = st_->next_seq[static_cast<std::size_t>(rank_)]++;
    State::Collective& c = st_->collectives[seq];
    if (c.posted == 0) {
      c.kind = kind;
      c.dtype = in.dtype;
      c.count = in.count;
      c.op = op;
      c.in.resize(static_cast<std::size_t>(st_->size));
      c.out.resize(static_cast<std::size_t>(st_->size));
    } else if (c.error.empty() &&
               (c.kind != kind || c.dtype != in.dtype || c.count != in.count || c.op != op)) {
      c.error = "collective #" + std::to_string(seq) + " does not match across ranks: rank " +
                std::to_string(rank_) + " called " + kind_name(kind) + " with " +
                std::to_string(in.count) + " " + dtype_name(in.dtype) + ", another rank " +
                kind_name(c.kind) + " with " + std::to_string(c.count) + " " +
                dtype_name(c.dtype);
    }
    c.in[static_cast<std::size_t>(rank_)] = in;
    c.out[static_cast<std::size_t>(rank_)] = out;
    if (++c.posted == st_->size) complete(*st_, c);
    return CommRequest(std::make_unique<CollectiveRequest>(st_, seq));
  }

  std::shared_ptr<State> st_;
  int rank_;
};

}  // namespace

LocalCommGroup::LocalCommGroup(int size) {
  require(size >= 1, ErrorKind::InvalidArgument,
          "a communicator group needs at least 1 rank, got " + std::to_string(size));
  state_ = std::make_shared<State>(size);
  for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<LocalComm>(state_, r));
}

LocalCommGroup::~LocalCommGroup() = default;

int LocalCommGroup::size() const { return state_->size; }

Communicator& LocalCommGroup::rank(int r) {
  require(r >= 0 && r < size(), ErrorKind::InvalidArgument,
          "rank " + std::to_string(r) + " of a group of " + std::to_string(size()));
  return *ranks_[static_cast<std::size_t>(r)];
}

void LocalCommGroup::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!state_->aborted) {
    state_->aborted = true;
    state_->abort_reason = reason;
  }
  state_->cv.notify_all();
}

void run_local_ranks(int size, const std::function<void(Communicator&)>& fn) {
  LocalCommGroup group(size);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::mutex first_mu;
  int first_failed = -1;  // the rank whose failure aborted the group (the root cause)
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      std::string what;
      try {
        fn(group.rank(r));
        return;
      } catch (const std::exception& e) {
        what = e.what();
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      } catch (...) {
        what = "unknown exception";
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(first_mu);
        if (first_failed < 0) first_failed = r;
      }
      group.abort("context-parallel group aborted: rank " + std::to_string(r) +
                  " failed: " + what);
    });
  for (std::thread& t : threads) t.join();
  if (first_failed >= 0) std::rethrow_exception(errors[static_cast<std::size_t>(first_failed)]);
}

}  // namespace csattn
