// One context-parallel rank's layer on the GPU (cp_layer.hpp). Per forward:
//
//   host: the run metadata, the owned-entry table, the per-run copies' sources, the halo
//         index lists (all from the layer plan; uploaded with the batch)
//   x rows -> halo exchange -> Q / K=V projections on the ext rows -> indexer compressor
//   (owned slots) -> all-gather posted -> main compressor -> all-gather posted -> indexer
//   queries (overlapping both gathers) -> per-run copies of the indexer keys -> top-k ->
//   per-run copies of the compressed KV -> attention -> output projections -> the rank's
//   rows out.
//
//   backward: dy on the own rows (halo rows 0) -> output projections -> attention -> the
//   compressed-KV gradient copies summed to rank-major rows -> reduce-scatter posted ->
//   indexer loss -> its key gradients likewise -> indexer queries -> Q path, K=V path ->
//   compressors on the owned slots -> halo gradients back to their owners.
//
// Collectives run on a second stream ordered after the main one by events, so a posted
// gather overlaps the launches queued after it; every rank posts the same collectives in
// the same order (decided by the agreed plan, never by a per-rank value).
#include "cuda/cp_layer.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <vector>

#include "cp/gpu_rank_plan.hpp"
#include "cuda/backward.hpp"
#include "cuda/check.hpp"
#include "cuda/cuda_layer.hpp"
#include "cuda/cp_rows.hpp"
#include "cuda/device_arena.hpp"
#include "cuda/device_weights.hpp"
#include "cuda/forward.hpp"
#include "cuda/gemm.hpp"
#include "cuda/host_bf16.hpp"
#include "cuda/kernels.hpp"
#include "cuda/workspace.hpp"

namespace csattn::cuda {

namespace {

using i32 = std::int32_t;

// Offsets of the CP buffers in one device allocation (256-byte aligned pieces).
struct CpBuffers {
  std::size_t bytes = 0;
  // index lists
  std::size_t seg_pos0 = 0, entry_row0 = 0, entry_pos = 0, dup_src = 0, sum_off = 0,
              sum_rows = 0, local_ext = 0, send_idx = 0, recv_idx = 0;
  // data
  std::size_t x_local = 0, halo_send = 0, halo_recv = 0, comp_slots = 0, idx_slots = 0,
              comp_gathered = 0, idx_gathered = 0, y_local = 0, topk_local = 0;
  std::size_t dy_local = 0, dcomp_rm = 0, didx_rm = 0, dcomp_slots = 0, didx_slots = 0,
              dx_send = 0, dx_recv = 0, dx_local = 0;
};

// host_io: staging for the host-tensor entry points (forward / backward): the rank's rows in
// and out (x, y, top-k, dy, dx: 10 x d_model + 4 x index_topk bytes a row). The device entry points read and write the caller's arrays
// directly, so their plan leaves those out (256-byte placeholders).
CpBuffers plan_cp_buffers(const AttentionConfig& c, const cp::GpuRankPlan& h, bool host_io) {
  CpBuffers b;
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t off = at;
    at += (std::max<std::size_t>(bytes, 1) + 255) / 256 * 256;
    return off;
  };
  const std::size_t i4 = 4, bf = 2, f4 = 4, dm = static_cast<std::size_t>(c.d_model);
  const std::size_t D = static_cast<std::size_t>(c.head_dim);
  const std::size_t DI = c.has_indexer() ? static_cast<std::size_t>(c.index_head_dim) : 0;
  const std::size_t C = static_cast<std::size_t>(h.C), PC = static_cast<std::size_t>(h.P) * C;
  const std::size_t n = static_cast<std::size_t>(h.n), staged = host_io ? n : 0;
  const std::size_t ns = h.send_idx.size(), nr = h.recv_idx.size();
  b.seg_pos0 = take(h.seg_pos0.size() * i4);
  b.entry_row0 = take(C * i4);
  b.entry_pos = take(C * i4);
  b.dup_src = take(h.dup_src.size() * i4);
  b.sum_off = take(h.sum_off.size() * i4);
  b.sum_rows = take(h.sum_rows.size() * i4);
  b.local_ext = take(n * i4);
  b.send_idx = take(ns * i4);
  b.recv_idx = take(nr * i4);
  b.x_local = take(staged * dm * bf);
  b.halo_send = take(ns * dm * bf);
  b.halo_recv = take(nr * dm * bf);
  b.comp_slots = take(C * D * bf);
  b.idx_slots = take(C * DI * bf);
  b.comp_gathered = take(PC * D * bf);
  b.idx_gathered = take(PC * DI * bf);
  b.y_local = take(staged * dm * bf);
  b.topk_local = take(staged * static_cast<std::size_t>(c.has_indexer() ? c.index_topk : 0) * i4);
  b.dy_local = take(staged * dm * bf);
  b.dcomp_rm = take(PC * D * f4);
  b.didx_rm = take(PC * DI * f4);
  b.dcomp_slots = take(C * D * f4);
  b.didx_slots = take(C * DI * f4);
  b.dx_send = take(nr * dm * f4);  // my halo rows' gradients go back to their owners
  b.dx_recv = take(ns * dm * f4);  // the rows I sent come back
  b.dx_local = take(staged * dm * f4);
  b.bytes = at;
  return b;
}

// The rank's forward workspace: its ext rows in runs, the compressed rows its runs' copies
// and its owned slots need.
WorkspacePlan rank_forward_plan(const AttentionConfig& c, const cp::GpuRankPlan& h) {
  return plan_forward(c, h.Te, h.R, h.max_pos, c.compress_ratio > 1 ? std::max(h.ndup, h.C) : 0);
}

template <class T>
void upload(const void* dst, const std::vector<T>& v, cudaStream_t s) {
  if (!v.empty())
    CSATTN_CUDA_CHECK(cudaMemcpyAsync(const_cast<void*>(dst), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, s));
}

CommBuffer device_buffer(void* p, std::size_t count, DType dt) { return {p, count, dt, Device::cuda}; }

// One message per peer of a halo exchange: peer k's rows [off[k], off[k+1]) of `base`, rows
// of `cols` values of `dt`.
std::vector<P2PMessage> row_messages(const std::vector<int>& peers, const std::vector<int>& off, void* base,
                                     int cols, DType dt) {
  std::vector<P2PMessage> out;
  auto* bytes = static_cast<unsigned char*>(base);
  const std::size_t row_bytes = dtype_size(dt) * static_cast<std::size_t>(cols);
  for (std::size_t k = 0; k < peers.size(); ++k) {
    const std::size_t rows = static_cast<std::size_t>(off[k + 1] - off[k]);
    out.push_back({peers[k], device_buffer(bytes + static_cast<std::size_t>(off[k]) * row_bytes,
                                           rows * static_cast<std::size_t>(cols), dt)});
  }
  return out;
}

}  // namespace

struct CudaCpLayerImpl {
  AttentionConfig cfg;
  int dm = 0, D = 0, DI = 0;  // d_model, head_dim, index_head_dim (0 without an indexer)
  int device = 0;
  cudaStream_t stream = nullptr, comm_stream = nullptr;
  cudaEvent_t ready = nullptr;
  std::vector<cudaEvent_t> done;  // one per collective in flight (kInFlight at most)
  static constexpr int kInFlight = 4;
  cublasHandle_t blas = nullptr;
  std::unique_ptr<DeviceWeightStore> weights;
  DeviceArena workspace, grad_workspace, cp;
  bool poison = false, deterministic = false;
  // The rank this layer serves (its GPU state is one rank's): set by the first forward.
  std::atomic<int> owner{-1};
  // The last forward.
  bool has_last = false;
  std::uint64_t generation = 0;
  cp::GpuRankPlan host;
  CpBuffers buf;
  WorkspacePlan plan;
  ForwardParams fwd;
  LayerDims comp_dims;       // the owned slots' compressed rows
  DeviceMetadata comp_meta;  // the owned-entry table
  float loss_scale = 0.0f;
  // The rank's rows in and out of the runs: the staging buffers (host entry points) or the
  // caller's device arrays (device entry points; profile re-runs on the last ones).
  bool host_io = true;
  const void* x_in = nullptr;   // bf16 [n, d_model]
  const void* dy_in = nullptr;  // bf16 [n, d_model]
  float* dx_out = nullptr;      // fp32 [n, d_model]
  // The last backward's plan and parameters (profile re-runs it).
  BackwardPlan grad_plan;
  BackwardParams bwd;
  bool has_backward = false;

  // A CP buffer of the current plan (an offset of `buf`).
  void* cpp(std::size_t off) const { return cp.at(off); }

  // The device work of a forward / backward on x_in / dy_in: collectives, launches, and the
  // rows' results (the outputs through write_forward_outputs, dx into dx_out).
  // The indexer loss value is the forward's last stage, apart (no collective) so that
  // profile() times it on its own as the single-GPU layer's profile does. Re-runnable.
  void run_forward(Communicator& comm);
  void run_forward_loss();
  void run_backward(Communicator& comm);
  // Before them: the plan, buffers and metadata of a forward (collective-free; checks the
  // rank), and the backward's buffers and parameters.
  void prepare_forward(const Communicator& comm, const BatchGeometry& geo, const cp::LayerPlan& plan,
                       bool host_io);
  void prepare_backward(const Communicator& comm, float grad_indexer_loss,
                        const float* grad_indexer_loss_on_device);
  bool forward_prepared = false, backward_prepared = false;
  // After a forward: this rank's output rows, top-k rows and loss share into the pointers
  // (device memory; topk and loss may be null), on the layer's stream.
  void write_forward_outputs(void* y, std::int32_t* topk, float* loss);

  ~CudaCpLayerImpl() {
    cudaSetDevice(device);  // the handles and (after this body) the members' memory are its
    if (blas) cublasDestroy(blas);
    if (ready) cudaEventDestroy(ready);
    for (cudaEvent_t e : done) cudaEventDestroy(e);
    if (comm_stream) cudaStreamDestroy(comm_stream);
    if (stream) cudaStreamDestroy(stream);
  }

  // A collective posted on the comm stream after the work queued on the main stream so
  // far, with the event that marks its end there. `slot` < kInFlight names the event (each
  // collective of a run its own, so waiting for one never waits for a later one).
  struct Posted {
    CommRequest req;
    cudaEvent_t end = nullptr;
  };
  template <class Post>
  Posted post(int slot, Post&& op) {
    CSATTN_CUDA_CHECK(cudaEventRecord(ready, stream));
    CSATTN_CUDA_CHECK(cudaStreamWaitEvent(comm_stream, ready, 0));
    Posted p{op(static_cast<CommStream>(comm_stream)), done[static_cast<std::size_t>(slot)]};
    CSATTN_CUDA_CHECK(cudaEventRecord(p.end, comm_stream));
    return p;
  }
  // Waits for a posted collective (the in-process group moves the data here; NCCL returns
  // once it has run), then orders the main stream after it.
  void finish(Posted& p) {
    p.req.wait();
    CSATTN_CUDA_CHECK(cudaStreamWaitEvent(stream, p.end, 0));
  }
};

void CudaCpLayerImpl::run_forward(Communicator& comm) {
  CudaCpLayerImpl& s = *this;
  const AttentionConfig& c = s.cfg;
  const cp::GpuRankPlan& h = s.host;
  const CpBuffers& b = s.buf;
  const ForwardParams& p = s.fwd;
  const DeviceMetadata& meta = p.meta;
  const cudaStream_t st = s.stream;
  use_blas(s.blas, st, p.blas_workspace, p.blas_workspace_bytes);
  launch_rope_table(p.dims, p.w.omega, meta.rope_table, st);

  // Hidden rows: own rows into their ext rows, halo rows from their owners.
  const int row_words = dm / 2;  // bf16 rows as 4-byte words (d_model is even)
  launch_scatter_rows(s.x_in, static_cast<const i32*>(cpp(b.local_ext)), h.n, row_words, p.act.x, st);
  launch_gather_rows(s.x_in, static_cast<const i32*>(cpp(b.send_idx)),
                     static_cast<int>(h.send_idx.size()), row_words, cpp(b.halo_send), st);
  {
    const std::vector<P2PMessage> sends = row_messages(h.send_peer, h.send_off, cpp(b.halo_send), dm, DType::bf16);
    const std::vector<P2PMessage> recvs = row_messages(h.recv_peer, h.recv_off, cpp(b.halo_recv), dm, DType::bf16);
    CudaCpLayerImpl::Posted halo = s.post(0, [&](CommStream cs) { return comm.exchange(sends, recvs, cs); });
    s.finish(halo);
  }
  launch_scatter_rows(cpp(b.halo_recv), static_cast<const i32*>(cpp(b.recv_idx)),
                      static_cast<int>(h.recv_idx.size()), row_words, p.act.x, st);

  forward_projections(p, s.blas, st);

  // The owned compressed groups into this rank's slots, all-gathered rank-major; the indexer
  // keys first (spec 02 §9). Unused slots are zero (their norm backward reads them).
  const int PC = h.P * h.C;
  auto compress_and_gather = [&](int slot, Compressor which, bf16* pooled, std::size_t slots_off,
                                 std::size_t gathered_off, int width) {
    CSATTN_CUDA_CHECK(cudaMemsetAsync(pooled, 0, sizeof(bf16) * static_cast<std::size_t>(h.C) * width, st));
    CSATTN_CUDA_CHECK(cudaMemsetAsync(cpp(slots_off), 0, sizeof(bf16) * static_cast<std::size_t>(h.C) * width, st));
    forward_compressor(p, which, s.comp_dims, s.comp_meta, pooled, static_cast<bf16*>(cpp(slots_off)), s.blas, st);
    return s.post(slot, [&](CommStream cs) {
      return comm.all_gather(device_buffer(cpp(slots_off), static_cast<std::size_t>(h.C) * width, DType::bf16),
                             device_buffer(cpp(gathered_off), static_cast<std::size_t>(PC) * width, DType::bf16), cs);
    });
  };
  CudaCpLayerImpl::Posted idx_gather, comp_gather;
  if (c.has_indexer()) idx_gather = compress_and_gather(1, Compressor::indexer, p.act.i_pooled, b.idx_slots, b.idx_gathered, DI);
  if (c.has_compressor()) comp_gather = compress_and_gather(2, Compressor::main, p.act.c_pooled, b.comp_slots, b.comp_gathered, D);

  const i32* dup_src = static_cast<const i32*>(cpp(b.dup_src));
  if (c.has_indexer()) {
    forward_indexer_queries(p, s.blas, st);  // overlaps the gathers
    s.finish(idx_gather);
    launch_gather_rows(cpp(b.idx_gathered), dup_src, h.ndup, DI / 2, p.act.i_keys, st);
    forward_selection(p, st);
  }
  if (c.has_compressor()) {
    s.finish(comp_gather);
    launch_gather_rows(cpp(b.comp_gathered), dup_src, h.ndup, D / 2, p.act.comp, st);
  }
  forward_attention(p, st);
  forward_output(p, s.blas, st);
}

void CudaCpLayerImpl::run_forward_loss() {
  // The indexer loss of this rank's rows (halo rows are padding), over the global count.
  if (cfg.has_indexer() && cfg.loss_coeff > 0.0) {
    BackwardParams bp;
    bp.sparse_loss = cfg.sparse_loss;
    run_indexer_loss(fwd, bp, stream);
  }
}

void CudaCpLayerImpl::run_backward(Communicator& comm) {
  CudaCpLayerImpl& s = *this;
  const AttentionConfig& c = s.cfg;
  const cp::GpuRankPlan& h = s.host;
  const CpBuffers& b = s.buf;
  const ForwardParams& f = s.fwd;
  const BackwardParams& bp = s.bwd;
  const BackwardPlan& gp = s.grad_plan;
  unsigned char* gws = static_cast<unsigned char*>(s.grad_workspace.base);
  const cudaStream_t st = s.stream;
  CSATTN_CUDA_CHECK(cudaMemsetAsync(gws + gp.grads_offset, 0, gp.grads_bytes, st));
  use_blas(s.blas, st, f.blas_workspace, f.blas_workspace_bytes);

  // dy: this rank's rows; halo rows get none (their outputs belong to other ranks).
  CSATTN_CUDA_CHECK(cudaMemsetAsync(bp.buf.dy, 0, sizeof(bf16) * static_cast<std::size_t>(h.Te) * dm, st));
  const i32* local_ext = static_cast<const i32*>(cpp(b.local_ext));
  launch_scatter_rows(s.dy_in, local_ext, h.n, dm / 2, bp.buf.dy, st);

  backward_output(f, bp, s.blas, st);
  backward_attention(f, bp, st);

  // The compressed rows' gradients: each run's copies summed (fixed order) into rank-major
  // rows, then reduce-scattered to their owners' slots; KV first, then indexer keys.
  const int PC = h.P * h.C;
  const i32* sum_off = static_cast<const i32*>(cpp(b.sum_off));
  const i32* sum_rows = static_cast<const i32*>(cpp(b.sum_rows));
  auto scatter_to_owners = [&](int slot, const float* copies, std::size_t rm_off,
                               std::size_t slots_off, int width) {
    launch_sum_rows(copies, sum_off, sum_rows, PC, width, static_cast<float*>(cpp(rm_off)), st);
    return s.post(slot, [&](CommStream cs) {
      return comm.reduce_scatter_sum(
          device_buffer(cpp(rm_off), static_cast<std::size_t>(PC) * width, DType::f32),
          device_buffer(cpp(slots_off), static_cast<std::size_t>(h.C) * width, DType::f32), cs);
    });
  };
  CudaCpLayerImpl::Posted comp_scatter, idx_scatter;
  if (c.has_compressor()) comp_scatter = scatter_to_owners(0, bp.buf.dcomp_acc, b.dcomp_rm, b.dcomp_slots, D);
  // The indexer's loss path: its reduce-scatter is posted whatever this rank's loss
  // gradient (the collectives never depend on a per-rank value).
  const bool loss_path = c.has_indexer() && c.loss_coeff > 0.0;
  const bool loss_grad = loss_path && indexer_loss_backward_runs(f, bp);
  if (loss_path) {
    if (loss_grad) {
      backward_indexer_loss(f, bp, st);
    } else {
      CSATTN_CUDA_CHECK(cudaMemsetAsync(bp.buf.dkeys_acc, 0, sizeof(float) * static_cast<std::size_t>(f.dims.comp_capacity) * DI, st));
    }
    idx_scatter = scatter_to_owners(1, bp.buf.dkeys_acc, b.didx_rm, b.didx_slots, DI);
    if (loss_grad) backward_indexer_queries(f, bp, s.blas, st);
  }

  backward_query_path(f, bp, s.blas, st);
  backward_kv_path(f, bp, s.blas, st);
  if (c.has_compressor()) {
    s.finish(comp_scatter);
    backward_compressor(f, bp, Compressor::main, s.comp_dims, s.comp_meta,
                        static_cast<const float*>(cpp(b.dcomp_slots)), s.blas, st);
  }
  if (loss_path) {
    s.finish(idx_scatter);
    if (loss_grad)
      backward_compressor(f, bp, Compressor::indexer, s.comp_dims, s.comp_meta,
                          static_cast<const float*>(cpp(b.didx_slots)), s.blas, st);
  }

  // Halo gradients back to the rows' owners: own rows first, then each peer's in ascending
  // rank order (the CPU layer's order).
  float* dx_local = s.dx_out;
  launch_gather_rows(bp.buf.dx, local_ext, h.n, dm, dx_local, st);
  launch_gather_rows(bp.buf.dx, static_cast<const i32*>(cpp(b.recv_idx)),
                     static_cast<int>(h.recv_idx.size()), dm, cpp(b.dx_send), st);
  {
    // The forward's transfers reversed: my halo rows go back, the rows I sent come back.
    const std::vector<P2PMessage> sends = row_messages(h.recv_peer, h.recv_off, cpp(b.dx_send), dm, DType::f32);
    const std::vector<P2PMessage> recvs = row_messages(h.send_peer, h.send_off, cpp(b.dx_recv), dm, DType::f32);
    CudaCpLayerImpl::Posted halo = s.post(2, [&](CommStream cs) { return comm.exchange(sends, recvs, cs); });
    s.finish(halo);
  }
  const i32* send_idx = static_cast<const i32*>(cpp(b.send_idx));
  for (std::size_t k = 0; k < h.send_peer.size(); ++k)  // peers ascending (plan order)
    launch_add_rows(static_cast<const float*>(cpp(b.dx_recv)) + static_cast<std::size_t>(h.send_off[k]) * dm,
                    send_idx + h.send_off[k], h.send_off[k + 1] - h.send_off[k], dm, dx_local, st);
}

CudaCpLayer::CudaCpLayer(const AttentionConfig& cfg, const LayerWeights& weights)
    : impl_(std::make_unique<CudaCpLayerImpl>()) {
  std::string why;
  const bool ok = device_available(&why);
  require(ok, ErrorKind::Unsupported, "device cuda: " + why);
  CudaCpLayerImpl& s = *impl_;
  s.cfg = cfg;
  s.dm = cfg.d_model;
  s.D = cfg.head_dim;
  s.DI = cfg.has_indexer() ? cfg.index_head_dim : 0;
  CSATTN_CUDA_CHECK(cudaGetDevice(&s.device));
  CSATTN_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  CSATTN_CUDA_CHECK(cudaStreamCreateWithFlags(&s.comm_stream, cudaStreamNonBlocking));
  CSATTN_CUDA_CHECK(cudaEventCreateWithFlags(&s.ready, cudaEventDisableTiming));
  s.done.resize(CudaCpLayerImpl::kInFlight);
  for (cudaEvent_t& e : s.done) CSATTN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CSATTN_CUBLAS_CHECK(cublasCreate(&s.blas));
  s.weights = std::make_unique<DeviceWeightStore>(cfg, weights);
}

CudaCpLayer::~CudaCpLayer() = default;

void CudaCpLayer::make_current() const { CSATTN_CUDA_CHECK(cudaSetDevice(impl_->device)); }
void CudaCpLayer::set_poison(bool on) { impl_->poison = on; }
void CudaCpLayer::set_deterministic(bool on) { impl_->deterministic = on; }
std::uint64_t CudaCpLayer::generation() const { return impl_->generation; }

std::size_t CudaCpLayer::device_bytes() const {
  const CudaCpLayerImpl& s = *impl_;
  return s.weights->bytes() + s.workspace.capacity + s.grad_workspace.capacity + s.cp.capacity;
}

void CudaCpLayerImpl::prepare_forward(const Communicator& comm, const BatchGeometry& geo,
                                      const cp::LayerPlan& plan, bool io_on_host) {
  CudaCpLayerImpl& s = *this;
  const AttentionConfig& c = s.cfg;
  s.forward_prepared = s.backward_prepared = false;  // a new forward voids any earlier prepare
  require(comm.accepts(Device::cuda), ErrorKind::Unsupported,
          "the " + comm.backend() + " communicator takes no device buffers: a device-cuda "
          "context-parallel layer needs NCCL (nccl_communicator) or the in-process group");
  require(comm.device() < 0 || comm.device() == s.device, ErrorKind::InvalidArgument,
          "the communicator runs on GPU " + std::to_string(comm.device()) + " but this rank's layer on GPU " +
              std::to_string(s.device) + " (construct the layer with its GPU current)");
  int expected = -1;
  const int rank = comm.rank();
  require(s.owner.compare_exchange_strong(expected, rank) || expected == rank,
          ErrorKind::InvalidArgument,
          "a device-cuda ContextParallelLayer holds one rank's GPU state and serves one rank: "
          "rank " + std::to_string(rank) + " called the layer of rank " + std::to_string(expected) +
              " (construct one layer per rank)");
  CSATTN_CUDA_CHECK(cudaSetDevice(s.device));
  ++s.generation;
  s.has_last = false;
  s.has_backward = false;
  s.host = cp::build_gpu_rank_plan(geo, plan);
  const cp::GpuRankPlan& h = s.host;
  const int K = c.has_indexer() ? c.index_topk : 0;
  const cudaStream_t st = s.stream;

  // Buffers (grow-only, outside the launches).
  s.plan = rank_forward_plan(c, h);
  s.host_io = io_on_host;
  s.buf = plan_cp_buffers(c, h, io_on_host);
  unsigned char* ws = s.workspace.reserve(s.plan.bytes);
  s.cp.reserve(s.buf.bytes);
  const CpBuffers& b = s.buf;
  if (s.poison) {  // NaN everywhere, top-k ids huge: a value nobody wrote shows up
    CSATTN_CUDA_CHECK(cudaMemsetAsync(ws, 0xFF, s.plan.bytes, st));
    CSATTN_CUDA_CHECK(cudaMemsetAsync(s.cp.base, 0xFF, s.buf.bytes, st));
    if (c.has_indexer())
      CSATTN_CUDA_CHECK(cudaMemsetAsync(ws + s.plan.topk, 0x7F, static_cast<std::size_t>(h.Te) * K * 4, st));
  }
  ForwardParams& p = s.fwd;
  p = ForwardParams{};
  p.dims = s.plan.dims;
  p.w = s.weights->weights();
  p.meta = s.plan.metadata(ws);
  p.act = s.plan.activations(ws);
  p.blas_workspace = ws + s.plan.blas;
  p.blas_workspace_bytes = WorkspacePlan::kBlasWorkspaceBytes;
  p.meta.seg_pos0 = static_cast<const i32*>(cpp(b.seg_pos0));
  DeviceMetadata& meta = p.meta;

  // Metadata: uploaded, not derived from cu_seqlens (launch_metadata is not run). The host
  // vectors live in s.host until the next forward.
  upload(meta.cu_padded, h.cu, st);
  upload(meta.cu_real, h.cu, st);
  upload(meta.row_segment, h.row_segment, st);
  upload(meta.row_position, h.row_position, st);
  upload(meta.row_is_padding, h.row_pad, st);
  upload(meta.comp_start, h.comp_start, st);
  upload(cpp(b.seg_pos0), h.seg_pos0, st);
  upload(cpp(b.entry_row0), h.entry_row0, st);
  upload(cpp(b.entry_pos), h.entry_pos, st);
  upload(cpp(b.dup_src), h.dup_src, st);
  upload(cpp(b.sum_off), h.sum_off, st);
  upload(cpp(b.sum_rows), h.sum_rows, st);
  upload(cpp(b.local_ext), h.local_ext, st);
  upload(cpp(b.send_idx), h.send_idx, st);
  upload(cpp(b.recv_idx), h.recv_idx, st);
  s.comp_dims = p.dims;
  s.comp_dims.comp_capacity = h.C;
  s.comp_meta = meta;
  s.comp_meta.comp_entry_row0 = static_cast<const i32*>(cpp(b.entry_row0));
  s.comp_meta.comp_entry_pos = static_cast<const i32*>(cpp(b.entry_pos));
  // The loss scale over the global real rows (the kernels read it from the device; a rank's
  // own cu_real counts its ext rows, so launch_metadata's would be wrong here).
  s.loss_scale = loss_scale_of(c, geo.real_rows);
  if (meta.loss_scale != nullptr)
    CSATTN_CUDA_CHECK(cudaMemcpyAsync(meta.loss_scale, &s.loss_scale, sizeof(float), cudaMemcpyHostToDevice, st));
  s.forward_prepared = true;
}

void CudaCpLayerImpl::write_forward_outputs(void* y, std::int32_t* topk, float* loss) {
  const AttentionConfig& c = cfg;
  const i32* local_ext = static_cast<const i32*>(cpp(buf.local_ext));
  launch_gather_rows(fwd.act.y, local_ext, host.n, c.d_model / 2, y, stream);
  if (topk && c.has_indexer()) launch_gather_rows(fwd.act.topk, local_ext, host.n, c.index_topk, topk, stream);
  if (loss) {
    if (c.has_indexer() && c.loss_coeff > 0.0)
      CSATTN_CUDA_CHECK(cudaMemcpyAsync(loss, fwd.act.loss, sizeof(float), cudaMemcpyDeviceToDevice, stream));
    else
      CSATTN_CUDA_CHECK(cudaMemsetAsync(loss, 0, sizeof(float), stream));
  }
}

void CudaCpLayerImpl::prepare_backward(const Communicator& comm, float grad_indexer_loss,
                                       const float* grad_indexer_loss_on_device) {
  CudaCpLayerImpl& s = *this;
  s.backward_prepared = false;
  require(s.has_last, ErrorKind::InvalidArgument, "backward needs a forward first");
  require(comm.rank() == s.owner.load(), ErrorKind::InvalidArgument,
          "backward on another rank than its forward's (construct one layer per rank)");
  CSATTN_CUDA_CHECK(cudaSetDevice(s.device));  // first: the check asks this device's limits
  // A gradient on the device may be anything: checked as if nonzero.
  check_backward_supported(s.cfg, s.fwd, s.deterministic,
                           grad_indexer_loss_on_device != nullptr ? 1.0f : grad_indexer_loss);
  s.grad_plan = plan_backward(s.cfg, s.fwd.dims, s.deterministic);
  unsigned char* gws = s.grad_workspace.reserve(s.grad_plan.bytes);
  BackwardParams& bp = s.bwd;
  bp = BackwardParams{};
  bp.buf = s.grad_plan.buffers(gws);
  bp.grad = s.grad_plan.gradients(gws);
  bp.grad_loss = grad_indexer_loss;
  bp.grad_loss_on_device = grad_indexer_loss_on_device;
  bp.sparse_loss = s.cfg.sparse_loss;
  bp.deterministic = s.deterministic;
  if (s.poison) CSATTN_CUDA_CHECK(cudaMemsetAsync(gws, 0xFF, s.grad_plan.grads_offset, s.stream));
  s.backward_prepared = true;
}

// The caller's stream and the layer's: `from` waits for what `to_wait_for` has queued.
static void stream_after(cudaStream_t from, cudaStream_t to_wait_for, cudaEvent_t ev) {
  CSATTN_CUDA_CHECK(cudaEventRecord(ev, to_wait_for));
  CSATTN_CUDA_CHECK(cudaStreamWaitEvent(from, ev, 0));
}

void CudaCpLayer::prepare_forward(const Communicator& comm, const BatchGeometry& geo,
                                  const cp::LayerPlan& plan, bool host_io) {
  impl_->prepare_forward(comm, geo, plan, host_io);
}

void CudaCpLayer::prepare_backward(const Communicator& comm, float grad_indexer_loss,
                                   const float* grad_indexer_loss_on_device) {
  impl_->prepare_backward(comm, grad_indexer_loss, grad_indexer_loss_on_device);
}

// The prepare_* call a run needs, consumed by it.
static void take_prepared(bool& flag, const char* what) {
  require(flag, ErrorKind::InvalidArgument, std::string(what) + " needs its prepare call first");
  flag = false;
}

CudaCpForward CudaCpLayer::forward(Communicator& comm, const Tensor& x_local) {
  CudaCpLayerImpl& s = *impl_;
  const AttentionConfig& c = s.cfg;
  require(s.host_io, ErrorKind::InvalidArgument,
          "forward: this forward was prepared for the device entry points (prepare_forward host_io)");
  take_prepared(s.forward_prepared, "forward");
  CSATTN_CUDA_CHECK(cudaSetDevice(s.device));
  const cp::GpuRankPlan& h = s.host;
  const int dm = c.d_model, K = c.has_indexer() ? c.index_topk : 0;
  const cudaStream_t st = s.stream;
  const std::vector<std::uint16_t> xb = to_bf16_bits(x_local.to_f32().data(), static_cast<std::size_t>(x_local.numel()));
  upload(s.cpp(s.buf.x_local), xb, st);
  s.x_in = s.cpp(s.buf.x_local);
  s.run_forward(comm);
  s.run_forward_loss();
  s.write_forward_outputs(s.cpp(s.buf.y_local), reinterpret_cast<std::int32_t*>(s.cpp(s.buf.topk_local)), nullptr);
  std::vector<std::uint16_t> yb(static_cast<std::size_t>(h.n) * dm);
  CudaCpForward out;
  CSATTN_CUDA_CHECK(cudaMemcpyAsync(yb.data(), s.cpp(s.buf.y_local), yb.size() * 2, cudaMemcpyDeviceToHost, st));
  if (c.has_indexer()) {
    out.topk = Tensor(DType::i32, {h.n, K});
    CSATTN_CUDA_CHECK(cudaMemcpyAsync(out.topk.data(), s.cpp(s.buf.topk_local), out.topk.nbytes(), cudaMemcpyDeviceToHost, st));
  }
  float loss = 0.0f;
  if (c.has_indexer() && c.loss_coeff > 0.0)
    CSATTN_CUDA_CHECK(cudaMemcpyAsync(&loss, s.fwd.act.loss, sizeof(float), cudaMemcpyDeviceToHost, st));
  CSATTN_CUDA_CHECK(cudaStreamSynchronize(st));
  out.output = tensor_from_bf16_bits(yb, h.n, dm);
  out.indexer_loss = loss;
  s.has_last = true;
  return out;
}

void CudaCpLayer::forward_device(Communicator& comm, const void* x_local, void* y,
                                 std::int32_t* topk, float* loss, void* stream) {
  CudaCpLayerImpl& s = *impl_;
  take_prepared(s.forward_prepared, "forward_device");
  CSATTN_CUDA_CHECK(cudaSetDevice(s.device));
  const auto caller = static_cast<cudaStream_t>(stream);
  stream_after(s.stream, caller, s.ready);  // x_local is ready on the caller's stream
  s.x_in = x_local;  // read in place (the halo rows gathered from it, its rows scattered)
  s.run_forward(comm);
  s.run_forward_loss();
  s.write_forward_outputs(y, topk, loss);
  stream_after(caller, s.stream, s.ready);
  s.has_last = true;
}

CudaCpGradients CudaCpLayer::backward(Communicator& comm, const Tensor& grad_output_local) {
  CudaCpLayerImpl& s = *impl_;
  require(s.host_io, ErrorKind::InvalidArgument,
          "backward: its forward was prepared for the device entry points");
  take_prepared(s.backward_prepared, "backward");
  CSATTN_CUDA_CHECK(cudaSetDevice(s.device));
  const AttentionConfig& c = s.cfg;
  const int n = s.host.n, dm = c.d_model;
  const std::vector<std::uint16_t> dyb =
      to_bf16_bits(grad_output_local.to_f32().data(), static_cast<std::size_t>(grad_output_local.numel()));
  upload(s.cpp(s.buf.dy_local), dyb, s.stream);
  s.dy_in = s.cpp(s.buf.dy_local);
  s.dx_out = static_cast<float*>(s.cpp(s.buf.dx_local));
  s.run_backward(comm);
  s.has_backward = true;
  CudaCpGradients out;
  out.grad_input = Tensor(DType::f32, {n, dm});
  CSATTN_CUDA_CHECK(cudaMemcpyAsync(out.grad_input.data(), s.cpp(s.buf.dx_local), out.grad_input.nbytes(),
                                    cudaMemcpyDeviceToHost, s.stream));
  out.grad = gradients_to_host(c, s.grad_plan, s.grad_workspace.base, s.stream);
  return out;
}

void CudaCpLayer::backward_device(Communicator& comm, const void* dy_local, float* dx_local,
                                  void* stream) {
  CudaCpLayerImpl& s = *impl_;
  take_prepared(s.backward_prepared, "backward_device");
  CSATTN_CUDA_CHECK(cudaSetDevice(s.device));
  const auto caller = static_cast<cudaStream_t>(stream);
  stream_after(s.stream, caller, s.ready);
  s.dy_in = dy_local;  // read and written in place: the caller's arrays
  s.dx_out = dx_local;
  s.run_backward(comm);
  stream_after(caller, s.stream, s.ready);
  s.has_backward = true;
}

std::map<std::string, const float*> CudaCpLayer::device_gradients() const {
  const CudaCpLayerImpl& s = *impl_;
  require(s.has_backward, ErrorKind::InvalidArgument, "device_gradients needs a backward first");
  return gradient_pointers(s.cfg, s.grad_plan, s.grad_workspace.base);
}

CudaCpProfile CudaCpLayer::profile(Communicator& comm, int warmup, int iters) {
  CudaCpLayerImpl& s = *impl_;
  require(s.has_last, ErrorKind::InvalidArgument, "profile needs a forward first");
  require(iters >= 1 && warmup >= 0, ErrorKind::InvalidArgument, "profile: iters >= 1, warmup >= 0");
  CSATTN_CUDA_CHECK(cudaSetDevice(s.device));
  auto timed = [&](auto&& run) {
    std::vector<double> ms;
    for (int i = 0; i < warmup + iters; ++i) {
      comm.barrier();  // every rank starts together: a run's time includes waiting for peers
      CSATTN_CUDA_CHECK(cudaStreamSynchronize(s.stream));
      const auto t0 = std::chrono::steady_clock::now();
      run();
      CSATTN_CUDA_CHECK(cudaStreamSynchronize(s.stream));
      const std::chrono::duration<double, std::milli> d = std::chrono::steady_clock::now() - t0;
      if (i >= warmup) ms.push_back(d.count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  CudaCpProfile out;
  out.forward_ms = timed([&] { s.run_forward(comm); });
  if (s.cfg.has_indexer() && s.cfg.loss_coeff > 0.0) out.loss_ms = timed([&] { s.run_forward_loss(); });
  if (s.has_backward) out.backward_ms = timed([&] { s.run_backward(comm); });
  return out;
}

CpRankMemory plan_cp_rank_memory(const AttentionConfig& c, const BatchGeometry& geo,
                                 const cp::LayerPlan& plan, bool deterministic, bool host_io) {
  // What prepare_forward and prepare_backward allocate for this rank.
  const cp::GpuRankPlan h = cp::build_gpu_rank_plan(geo, plan);
  const WorkspacePlan f = rank_forward_plan(c, h);
  const BackwardPlan b = plan_backward(c, f.dims, deterministic);
  return {f.bytes, plan_cp_buffers(c, h, host_io).bytes, b.bytes, b.grads_bytes};
}

}  // namespace csattn::cuda
