// ContextParallelLayer: the attention layer of one rank of a context-parallel group (spec 02),
// composed from the same operators as the single-rank layer (src/cpu/), which take explicit
// query rows, index lists and compressor entries, and from the same layer stages
// (cpu/layer_ops.hpp: Q, K=V, indexer queries, output projections). Per layer and rank:
//
//   forward:  agree -> halo exchange of hidden rows -> Q on local rows, K=V on halo + local
//             rows -> owned compressed groups (indexer compressor first) -> rank-major
//             all-gathers (posted, overlapped) -> indexer top-k with global positions ->
//             loss -> index lists lowered to kv_full -> attention -> output projections
//   backward: agree -> output projections -> attention -> Q path; K=V path on ext rows ->
//             reduce-scatters of the compressed-row gradients (KV first, then indexer K) ->
//             compressor backwards -> halo gradients back to their owners.
//
// Every collective is decided by metadata the ranks agreed on, so all ranks issue the same
// sequence.
#include <cmath>
#include <cstdint>
#include <functional>
#include <cstring>
#include <limits>
#include <vector>

#include "core/attention_index.hpp"
#include "core/geometry.hpp"
#include "cp/agreement.hpp"
#include "cp/layer_plan.hpp"
#include "cpu/attention.hpp"
#include "cpu/blas.hpp"
#include "cpu/compressor.hpp"
#include "cpu/elementwise.hpp"
#include "cpu/indexer_loss.hpp"
#include "cpu/layer_ops.hpp"
#include "csattn/cp.hpp"
#include "core/run_options_check.hpp"
#include "csattn/error.hpp"
#ifdef CSATTN_HAVE_CUDA
#include "cuda/cp_layer.hpp"
#endif

namespace csattn {

struct CpSavedActivations {
  AttentionConfig cfg;
  std::uint64_t gpu_generation = 0;  // device cuda: the GPU layer's forward it belongs to
  bool bf16 = false;
  int rank = 0, ranks = 1;
  std::uint64_t layout_checksum = 0;
  BatchGeometry geo;   // global
  cp::LayerPlan plan;  // this rank's
  std::vector<float> x_local, x_ext;         // [local, dm], [ext, dm]
  cpu::QueryPath query;                      // local
  cpu::KvPath kv;                            // ext
  cpu::CompressorState comp, idx_comp;       // owned entries over ext rows
  std::vector<float> comp_rank_major;        // [P*C, D] gathered compressed rows
  std::vector<float> comp_seq;               // [Nc, D] sequence-major (teacher)
  std::vector<float> idx_rank_major;         // [P*C, D_I] gathered indexer keys
  std::vector<float> idx_seq;                // [Nc, D_I] sequence-major
  cpu::IndexerPath indexer;                  // local queries, head weights, top-k
  AttentionIndex index;                      // local queries -> kv_full rows
  std::vector<float> attn, lse, attn_rot, u;  // local
};

namespace {

using cpu::round_to_storage;
using cpu::zeros;

cpu::IndexedAttentionArgs attention_args(const CpSavedActivations& s, const LayerWeights& w) {
  const AttentionConfig& c = s.cfg;
  cpu::IndexedAttentionArgs a;
  a.heads = c.n_heads;
  a.dim = c.head_dim;
  a.scale = cpu::attention_scale(c);
  a.q = s.query.q.data();
  a.kv = {s.kv.kv.data(), static_cast<int>(s.plan.ext_rows.size()),
          c.has_compressor() ? s.comp_rank_major.data() : nullptr,
          c.has_compressor() ? s.plan.ranks * s.plan.slots : 0};
  a.sink = w.f32("attn.attn_sink");
  a.index = s.index.index.data();
  a.width = s.index.width();
  a.bf16 = s.bf16;
  return a;
}

// This rank's query rows (its local rows; their K=V rows in the halo + local buffer).
QueryRows local_queries(const CpSavedActivations& s) {
  return {&s.geo, static_cast<int>(s.plan.local_rows.size()), s.plan.local_rows.data(),
          s.plan.local_ext.data()};
}

// The halo + local rows in x_ext order (K=V is computed on them).
QueryRows ext_rows(const CpSavedActivations& s) {
  return {&s.geo, static_cast<int>(s.plan.ext_rows.size()), s.plan.ext_rows.data(), nullptr};
}

cpu::LossArgs loss_args(const CpSavedActivations& s, const LayerWeights& w) {
  return cpu::loss_args(s.cfg, w, s.indexer, s.idx_seq.data(), s.query.q.data(),
                        s.kv.kv.data(), s.comp_seq.data());
}

// Sends rows send[k].rows of src [*, cols] to send[k].peer and receives recv[k].rows.size()
// rows from recv[k].peer, in one exchange; returns the received rows of each transfer.
std::vector<std::vector<float>> exchange_rows(Communicator& comm,
                                              const std::vector<cp::HaloTransfer>& send,
                                              const float* src,
                                              const std::vector<cp::HaloTransfer>& recv,
                                              int cols) {
  std::vector<std::vector<float>> send_buf, recv_buf;
  std::vector<P2PMessage> sends, recvs;
  for (const cp::HaloTransfer& t : send) {
    std::vector<float>& b = send_buf.emplace_back(t.rows.size() * static_cast<std::size_t>(cols));
    for (std::size_t i = 0; i < t.rows.size(); ++i)
      std::memcpy(b.data() + i * cols, src + static_cast<std::size_t>(t.rows[i]) * cols,
                  sizeof(float) * cols);
  }
  for (std::size_t k = 0; k < send.size(); ++k)
    sends.push_back({send[k].peer, comm_buffer(send_buf[k].data(), send_buf[k].size())});
  for (const cp::HaloTransfer& t : recv)
    recv_buf.emplace_back(t.rows.size() * static_cast<std::size_t>(cols));
  for (std::size_t k = 0; k < recv.size(); ++k)
    recvs.push_back({recv[k].peer, comm_buffer(recv_buf[k].data(), recv_buf[k].size())});
  comm.exchange(sends, recvs).wait();
  return recv_buf;
}

// Forward halo exchange: x_ext gets the local rows and the halo rows from their owners.
void exchange_halo(Communicator& comm, const cp::LayerPlan& plan, const float* x_local,
                   int cols, float* x_ext) {
  const std::size_t row_bytes = sizeof(float) * static_cast<std::size_t>(cols);
  for (std::size_t e = 0; e < plan.ext_rows.size(); ++e)
    if (plan.ext_local[e] >= 0)
      std::memcpy(x_ext + e * cols, x_local + static_cast<std::size_t>(plan.ext_local[e]) * cols,
                  row_bytes);
  const std::vector<std::vector<float>> recv =
      exchange_rows(comm, plan.halo_send, x_local, plan.halo_receive, cols);
  for (std::size_t k = 0; k < plan.halo_receive.size(); ++k) {
    const cp::HaloTransfer& t = plan.halo_receive[k];
    for (std::size_t i = 0; i < t.rows.size(); ++i)
      std::memcpy(x_ext + static_cast<std::size_t>(t.rows[i]) * cols, recv[k].data() + i * cols,
                  row_bytes);
  }
}

// Backward halo exchange: the gradients of ext rows go to their owners and are summed into
// the owners' rows (local contributions first, then the peers' in ascending rank order).
void return_halo_gradients(Communicator& comm, const cp::LayerPlan& plan, const float* dx_ext,
                           int cols, float* dx_local) {
  for (std::size_t e = 0; e < plan.ext_rows.size(); ++e) {
    if (plan.ext_local[e] < 0) continue;
    float* dst = dx_local + static_cast<std::size_t>(plan.ext_local[e]) * cols;
    const float* src = dx_ext + e * cols;
    for (int j = 0; j < cols; ++j) dst[j] += src[j];
  }
  // My halo rows go back; the rows I sent forward come back.
  const std::vector<std::vector<float>> recv =
      exchange_rows(comm, plan.halo_receive, dx_ext, plan.halo_send, cols);
  for (std::size_t k = 0; k < plan.halo_send.size(); ++k) {
    const cp::HaloTransfer& t = plan.halo_send[k];
    for (std::size_t i = 0; i < t.rows.size(); ++i) {
      float* dst = dx_local + static_cast<std::size_t>(t.rows[i]) * cols;
      const float* src = recv[k].data() + i * cols;
      for (int j = 0; j < cols; ++j) dst[j] += src[j];
    }
  }
}

// The owned entries' rows placed into this rank's C slots (unused slots 0, or NaN).
std::vector<float> fill_slots(const cp::LayerPlan& plan, const std::vector<float>& entries_out,
                              int d, bool poison) {
  std::vector<float> slots(static_cast<std::size_t>(plan.slots) * d,
                           poison ? std::numeric_limits<float>::quiet_NaN() : 0.0f);
  for (std::size_t k = 0; k < plan.entry_slot.size(); ++k)
    std::memcpy(slots.data() + static_cast<std::size_t>(plan.entry_slot[k]) * d,
                entries_out.data() + k * d, sizeof(float) * d);
  return slots;
}

// Sequence-major rows j < Nc of a rank-major gathered buffer (index_select through the map).
std::vector<float> sequence_major(const cp::LayerPlan& plan, const BatchGeometry& geo,
                                  const std::vector<float>& rank_major, int d) {
  const int nc = geo.compressed_rows();
  std::vector<float> seq(static_cast<std::size_t>(nc) * d);
  for (int j = 0; j < nc; ++j)
    std::memcpy(seq.data() + static_cast<std::size_t>(j) * d,
                rank_major.data() + static_cast<std::size_t>(plan.seq_to_rank_row[j]) * d,
                sizeof(float) * d);
  return seq;
}

std::string shape_error(const char* name, const Tensor& t, std::int64_t rows, int cols) {
  if (t.ndim() == 2 && t.dim(0) == rows && t.dim(1) == cols) return "";
  return std::string(name) + " has shape " + shape_str(t.shape()) + ", expected [" +
         std::to_string(rows) + ", " + std::to_string(cols) + "] (this rank's rows)";
}

#ifdef CSATTN_HAVE_CUDA
// Runs a rank's local preparation (the GPU layer's plan and buffers: where one rank can fail
// alone, e.g. out of memory on the rank with the longest prefix) and agrees on its outcome,
// so a failure becomes the same csattn::Error on every rank instead of a hang in the next
// collective (NCCL waits cannot be aborted by a peer's exception).
void agreed_prepare(Communicator& comm, const char* operation, const std::function<void()>& prepare) {
  std::string error;
  try {
    prepare();
  } catch (const std::exception& e) {
    error = e.what();
  } catch (...) {
    error = "an unknown exception";
  }
  cp::agree(comm, (std::string(operation) + " (buffers)").c_str(), {}, error);
}
#endif

// The work and traffic of this rank's forward. Attention pairs per own row: its window
// (min(W, pos + 1) rows) plus its compressed keys (CSA: the valid top-k ids; HCA: every
// visible entry).
CpWork rank_work(const AttentionConfig& c, const BatchGeometry& geo, const cp::LayerPlan& plan,
                 const Tensor& topk, const CommStats& after, const CommStats& before) {
  CpWork work;
  const int n = static_cast<int>(plan.local_rows.size());
  work.local_rows = n;
  work.halo_rows = static_cast<std::int64_t>(plan.ext_rows.size()) - n;
  work.owned_compressed = static_cast<std::int64_t>(plan.entries.size());
  work.compressed_slots = plan.slots;
  const int K = c.has_indexer() ? c.index_topk : 0;
  for (int i = 0; i < n; ++i) {
    const int g = plan.local_rows[static_cast<std::size_t>(i)];
    const int pos = geo.row_position[static_cast<std::size_t>(g)];
    work.attention_pairs += std::min(c.window, pos + 1);
    if (c.has_indexer()) {
      const std::int32_t* sel = topk.ptr<std::int32_t>() + static_cast<std::size_t>(i) * K;
      for (int k = 0; k < K; ++k) work.attention_pairs += sel[k] >= 0;
      if (!geo.row_is_padding[static_cast<std::size_t>(g)]) work.indexer_pairs += geo.visible_compressed(g);
    } else if (c.has_compressor()) {
      work.attention_pairs += geo.visible_compressed(g);
    }
  }
  work.attention_flops = 4.0 * c.n_heads * c.head_dim * static_cast<double>(work.attention_pairs);
  work.forward_comm = {after.bytes_sent - before.bytes_sent,
                       after.bytes_received - before.bytes_received,
                       after.operations - before.operations};
  return work;
}

}  // namespace

ContextParallelLayer::ContextParallelLayer(AttentionConfig cfg, LayerWeights weights,
                                           RunOptions options, CpLayerOptions cp_options)
    : cfg_(cfg), weights_(std::move(weights)), options_(options), cp_options_(cp_options) {
  cfg_.validate();
  weights_.check(cfg_);
  check_run_options(options_);
  weights_checksum_ = cp::checksum(weights_);
  if (options_.device == Device::cuda) {
#ifdef CSATTN_HAVE_CUDA
    gpu_ = std::make_shared<cuda::CudaCpLayer>(cfg_, weights_);
    gpu_->set_poison(options_.poison_workspace || cp_options_.poison_unused);
    gpu_->set_deterministic(options_.deterministic);
#endif
  }
}

int ContextParallelLayer::halo_rows() const {
  return cp::halo_width(cfg_.window, cfg_.compress_ratio);
}

void ContextParallelLayer::agree_forward(Communicator& comm, const CpPartition& part,
                                         const std::string& local_error) const {
  const AttentionConfig& c = cfg_;
  const int P = comm.size();
#ifdef CSATTN_HAVE_CUDA
  if (gpu_) gpu_->make_current();  // the agreement may travel through the GPU (NCCL)
#endif
  cp::agree(comm, "context-parallel forward",
            {{"cu_seqlens", cp::checksum(part.layout().cu_seqlens())},
             {"cu_seqlens_padded", cp::checksum(part.layout().cu_seqlens_padded())},
             {"the partition mode", static_cast<std::uint64_t>(part.mode())},
             {"the layer config", cp::checksum(c)},
             {"the layer weights", weights_checksum_},
             {"the precision", static_cast<std::uint64_t>(options_.precision)},
             {"the device", static_cast<std::uint64_t>(options_.device)}},
            local_error);

  // Global rules (the same verdict on every rank).
  const int d_w = halo_rows();
  const std::int64_t T = part.total_rows();
  if (part.mode() == CpMode::contiguous && P > 1) {
    const std::int64_t L = T / P;
    require(L >= d_w, ErrorKind::InvalidArgument,
            "contiguous partition: each rank's local width L = T/P = " + std::to_string(T) +
                "/" + std::to_string(P) + " = " + std::to_string(L) + " is smaller than D_w = " +
                "max(window, D_c) = " + std::to_string(d_w) + " of this " +
                layer_kind_name(c.kind()) + " layer (its halo must come from the left " +
                "neighbour alone): pad the batch to at least P*D_w = " +
                std::to_string(std::int64_t{P} * d_w) +
                " rows (cu_seqlens_padded), use fewer ranks, or use two_chunk");
  }
}

CpLayerOutputs ContextParallelLayer::forward(Communicator& comm, const CpPartition& part,
                                             const Tensor& x_local) const {
  const AttentionConfig& c = cfg_;
  const int P = comm.size(), rank = comm.rank();
  const CommStats comm_before = comm.stats();

  // Agreement before any other collective: the same metadata everywhere, no local error.
  std::string local_error;
  if (part.ranks() != P)
    local_error = "the partition is over " + std::to_string(part.ranks()) +
                  " ranks but the communicator has " + std::to_string(P);
  else
    local_error = shape_error("hidden_states", x_local, part.local_rows(rank), c.d_model);
  const std::uint64_t layout_sum =
      cp::checksum(part.layout().cu_seqlens()) ^ (cp::checksum(part.layout().cu_seqlens_padded()) * 31);
  agree_forward(comm, part, local_error);

  cpu::ThreadScope threads(options_.threads);
  const cpu::BatchInvariantScope batch_invariant(options_.precision == Precision::fp32);
  const LayerWeights& w = weights_;
  auto s = std::make_shared<CpSavedActivations>();
  s->cfg = c;
  s->bf16 = options_.precision == Precision::bf16;
  s->rank = rank;
  s->ranks = P;
  s->layout_checksum = layout_sum;
  s->geo = BatchGeometry::build(part.layout(), c.compress_ratio);
  s->plan = cp::build_layer_plan(s->geo, part, rank, c.window);
  const BatchGeometry& geo = s->geo;
  const cp::LayerPlan& plan = s->plan;
  const bool bf16 = s->bf16;
  const int n = static_cast<int>(plan.local_rows.size());
  const int ne = static_cast<int>(plan.ext_rows.size());
  const int H = c.n_heads, D = c.head_dim, dm = c.d_model;
  const QueryRows queries = local_queries(*s);
#ifdef CSATTN_HAVE_CUDA
  if (gpu_) {
    agreed_prepare(comm, "context-parallel forward", [&] { gpu_->prepare_forward(comm, geo, plan, true); });
    cuda::CudaCpForward g = gpu_->forward(comm, x_local);
    s->gpu_generation = gpu_->generation();
    device_layout_ = 0;  // a backward_device now has no forward_device to differentiate
    CpLayerOutputs out;
    out.output = std::move(g.output);
    out.topk_indices = std::move(g.topk);
    out.indexer_loss = g.indexer_loss;
    out.work = rank_work(c, geo, plan, out.topk_indices, comm.stats(), comm_before);
    out.saved = std::move(s);
    return out;
  }
#endif
  const cpu::RopeTable rope = cpu::make_rope(c, bf16);

  s->x_local = x_local.to_f32();
  round_to_storage(s->x_local.data(), static_cast<long>(s->x_local.size()), bf16);
  s->x_ext.assign(static_cast<std::size_t>(ne) * dm,
                  cp_options_.poison_unused ? std::numeric_limits<float>::quiet_NaN() : 0.0f);
  exchange_halo(comm, plan, s->x_local.data(), dm, s->x_ext.data());

  // Query path on the local rows; K=V on the halo + local rows (boundary K=V recomputed here
  // from the received rows).
  cpu::query_forward(c, w, rope, queries, s->x_local.data(), bf16, s->query);
  cpu::kv_forward(c, w, rope, ext_rows(*s), s->x_ext.data(), bf16, s->kv);

  // Compressed rows: the owned groups, into this rank's slots, all-gathered rank-major. The
  // indexer keys go first (spec 02 §9), both gathers overlap the work that follows.
  const int ne_own = static_cast<int>(plan.entries.size());
  const int DI = c.index_head_dim, K = c.index_topk;
  auto compress_and_gather = [&](const cpu::CompressorSpec& spec, const std::string& prefix,
                                 cpu::CompressorState& st, std::vector<float>& slots,
                                 std::vector<float>& rank_major) {
    cpu::compressor_forward(plan.entries.data(), ne_own, c.compress_ratio, spec, rope,
                            s->x_ext.data(), ne, dm, cpu::compressor_weights(w, prefix), st);
    slots = fill_slots(plan, st.out, spec.d, cp_options_.poison_unused);
    rank_major.assign(static_cast<std::size_t>(P) * plan.slots * spec.d, 0.0f);
    return comm.all_gather(comm_buffer(slots.data(), slots.size()),
                           comm_buffer(rank_major.data(), rank_major.size()));
  };
  std::vector<float> comp_slots, idx_slots;
  CommRequest idx_gather, comp_gather;
  if (c.has_indexer())  // the indexer compressor sees the hidden rows detached: no dx
    idx_gather = compress_and_gather(cpu::indexer_compressor_spec(c, bf16),
                                     "attn.indexer.compressor.", s->idx_comp, idx_slots,
                                     s->idx_rank_major);
  if (c.has_compressor())
    comp_gather = compress_and_gather(cpu::main_compressor_spec(c, bf16), "attn.compressor.",
                                      s->comp, comp_slots, s->comp_rank_major);

  CpLayerOutputs out;
  if (c.has_indexer()) {
    // Indexer queries and head weights on the local rows (detached inputs cq and x).
    cpu::indexer_query_forward(c, w, rope, queries, s->query.cq.data(), s->x_local.data(), bf16,
                               s->indexer);
    // Top-k: the compact indexer of the single-rank layer, the local queries scoring their
    // sequence's keys at their global positions (causal offsets).
    idx_gather.wait();
    s->idx_seq = sequence_major(plan, geo, s->idx_rank_major, DI);
    cpu::indexer_select(c, queries, s->idx_seq.data(), s->indexer);
    out.topk_indices = Tensor(DType::i32, {n, K});
    std::memcpy(out.topk_indices.data(), s->indexer.topk.data(),
                sizeof(std::int32_t) * s->indexer.topk.size());
  }
  if (c.has_compressor()) comp_gather.wait();
  if (c.has_indexer() && c.loss_coeff > 0.0) {
    s->comp_seq = sequence_major(plan, geo, s->comp_rank_major, D);
    // Divided by the global real-row count (geo), so the ranks' losses add up to CP=1's.
    out.indexer_loss = static_cast<float>(cpu::indexer_loss_forward(queries, loss_args(*s, w)));
  }

  // Index lists into kv_full = cat(halo + local K=V, rank-major compressed rows).
  KvLowering low;
  low.compressed_base = ne;
  low.seq_to_rank_row = c.has_compressor() ? plan.seq_to_rank_row.data() : nullptr;
  low.seq_major_rows = plan.seq_major_rows;
  const int cw = compressed_width(c, part.layout().max_seg_len(), c.has_indexer());
  s->index = build_attention_index(
      queries, c.has_indexer() ? IndexMode::selected : IndexMode::all_visible, c.window, cw,
      c.has_indexer() ? s->indexer.topk.data() : nullptr, low);

  s->attn = zeros(static_cast<std::size_t>(n) * H * D);
  s->lse = zeros(static_cast<std::size_t>(n) * H);
  cpu::attention_forward(n, attention_args(*s, w), s->attn.data(), s->lse.data());
  out.output = cpu::output_forward(c, w, rope, queries, s->attn, bf16, s->attn_rot, s->u);

  out.work = rank_work(c, geo, plan, out.topk_indices, comm.stats(), comm_before);
  out.saved = std::move(s);
  return out;
}

CpLayerGradients ContextParallelLayer::backward(Communicator& comm, const CpLayerOutputs& fwd,
                                                const Tensor& grad_output,
                                                float grad_indexer_loss) const {
  const AttentionConfig& c = cfg_;
  const CommStats comm_before = comm.stats();
  std::string local_error;
  std::uint64_t layout_sum = 0;
  if (fwd.saved == nullptr) {
    local_error = "backward needs the outputs of a forward of this layer";
  } else if (fwd.saved->rank != comm.rank() || fwd.saved->ranks != comm.size()) {
    local_error = "the forward ran as rank " + std::to_string(fwd.saved->rank) + " of " +
                  std::to_string(fwd.saved->ranks) + ", not on this communicator";
  } else {
    layout_sum = fwd.saved->layout_checksum;
    local_error = shape_error("grad_output", grad_output,
                              static_cast<std::int64_t>(fwd.saved->plan.local_rows.size()),
                              c.d_model);
    if (local_error.empty() && !std::isfinite(grad_indexer_loss))
      local_error = "grad_indexer_loss must be finite";
#ifdef CSATTN_HAVE_CUDA
    if (local_error.empty() && gpu_ && fwd.saved->gpu_generation != gpu_->generation())
      local_error = "backward on device cuda must follow the forward it differentiates: the GPU "
                    "keeps only the last forward's activations";
#endif
  }
#ifdef CSATTN_HAVE_CUDA
  if (gpu_) gpu_->make_current();
#endif
  cp::agree(comm, "context-parallel backward",
            {{"the layout of the forward", layout_sum},
             {"the layer config", cp::checksum(c)},
             {"the layer weights", weights_checksum_},
             {"the device", static_cast<std::uint64_t>(options_.device)}},
            local_error);

#ifdef CSATTN_HAVE_CUDA
  if (gpu_) {
    agreed_prepare(comm, "context-parallel backward",
                   [&] { gpu_->prepare_backward(comm, grad_indexer_loss); });
    cuda::CudaCpGradients g = gpu_->backward(comm, grad_output);
    CpLayerGradients out;
    out.grad_input = std::move(g.grad_input);
    out.grad = std::move(g.grad);
    const CommStats& after = comm.stats();
    out.backward_comm = {after.bytes_sent - comm_before.bytes_sent,
                         after.bytes_received - comm_before.bytes_received,
                         after.operations - comm_before.operations};
    return out;
  }
#endif
  cpu::ThreadScope threads(options_.threads);
  const CpSavedActivations& s = *fwd.saved;
  const BatchGeometry& geo = s.geo;
  const cp::LayerPlan& plan = s.plan;
  const int P = s.ranks;
  const int n = static_cast<int>(plan.local_rows.size());
  const int ne = static_cast<int>(plan.ext_rows.size());
  const int H = c.n_heads, D = c.head_dim, dm = c.d_model;
  const LayerWeights& w = weights_;
  LayerWeights g = LayerWeights::zeros(c);
  const QueryRows queries = local_queries(s);
  const cpu::RopeTable rope = cpu::make_rope(c, false);  // gradients stay fp32
  const std::vector<float> dy = grad_output.to_f32();
  std::vector<float> dx = zeros(static_cast<std::size_t>(n) * dm);
  std::vector<float> dx_ext = zeros(static_cast<std::size_t>(ne) * dm);

  // Output projections.
  std::vector<float> dattn =
      cpu::output_backward(c, w, rope, queries, s.attn_rot, s.u, dy.data(), g);

  // Attention: gradients of the local queries and of every kv_full row.
  const int comp_rows = c.has_compressor() ? P * plan.slots : 0;
  std::vector<float> dq = zeros(static_cast<std::size_t>(n) * H * D);
  std::vector<float> dkv = zeros(static_cast<std::size_t>(ne) * D);
  std::vector<float> dcomp_rank_major = zeros(static_cast<std::size_t>(comp_rows) * D);
  cpu::attention_backward(n, attention_args(s, w), s.attn.data(), s.lse.data(), dattn.data(),
                          dq.data(), dkv.data(), dcomp_rank_major.data(),
                          g.f32("attn.attn_sink"));

  // The gradients of rank-major compressed rows [P*C, d], summed into their owners' slots
  // [C, d] (posted; both buffers live until the wait).
  auto scatter_to_owners = [&](std::vector<float>& rank_major, int d,
                               std::vector<float>& slots) {
    slots = zeros(static_cast<std::size_t>(plan.slots) * d);
    return comm.reduce_scatter_sum(comm_buffer(rank_major.data(), rank_major.size()),
                                   comm_buffer(slots.data(), slots.size()));
  };

  // Compressed-KV gradients to their owners (posted first, spec 02 §9).
  std::vector<float> dcomp_slots;
  CommRequest comp_scatter;
  if (c.has_compressor()) comp_scatter = scatter_to_owners(dcomp_rank_major, D, dcomp_slots);

  // The indexer loss: local q_idx / w gradients; key gradients through the map to rank-major
  // rows and on to their owners (posted even when grad_indexer_loss is 0: the collectives
  // never depend on a per-rank value).
  const bool loss_path = c.has_indexer() && c.loss_coeff > 0.0;
  const int HI = c.index_n_heads, DI = c.index_head_dim;
  std::vector<float> didx_rank_major, didx_slots;
  CommRequest idx_scatter;
  if (loss_path) {
    std::vector<float> dqi = zeros(static_cast<std::size_t>(n) * HI * DI);
    std::vector<float> dweff = zeros(static_cast<std::size_t>(n) * HI);
    std::vector<float> dkeys = zeros(static_cast<std::size_t>(geo.compressed_rows()) * DI);
    if (grad_indexer_loss != 0.0f)
      cpu::indexer_loss_backward(queries, loss_args(s, w), grad_indexer_loss, dqi.data(),
                                 dweff.data(), dkeys.data());
    didx_rank_major = zeros(static_cast<std::size_t>(P) * plan.slots * DI);
    for (int j = 0; j < geo.compressed_rows(); ++j) {
      float* dst = didx_rank_major.data() + static_cast<std::size_t>(plan.seq_to_rank_row[j]) * DI;
      const float* src = dkeys.data() + static_cast<std::size_t>(j) * DI;
      for (int d = 0; d < DI; ++d) dst[d] += src[d];
    }
    idx_scatter = scatter_to_owners(didx_rank_major, DI, didx_slots);
    cpu::indexer_query_backward(c, rope, queries, s.query.cq.data(), s.x_local.data(), dqi,
                                dweff, g);
  }

  // Query path back to the local rows; K=V path back to the halo + local rows.
  cpu::query_backward(c, w, rope, queries, s.query, s.x_local.data(), dq, g, dx.data());
  cpu::kv_backward(c, w, rope, ext_rows(s), s.kv, s.x_ext.data(), dkv, g, dx_ext.data());

  // A compressor's backward on the owned entries, from the gradients of this rank's slots.
  const int ne_own = static_cast<int>(plan.entries.size());
  auto owned_compressor_backward = [&](const cpu::CompressorSpec& spec, const std::string& prefix,
                                       const cpu::CompressorState& st,
                                       const std::vector<float>& dslots, float* dx_rows) {
    const int d = spec.d;
    std::vector<float> dentries(static_cast<std::size_t>(ne_own) * d);
    for (int k = 0; k < ne_own; ++k)
      std::memcpy(dentries.data() + static_cast<std::size_t>(k) * d,
                  dslots.data() + static_cast<std::size_t>(plan.entry_slot[k]) * d,
                  sizeof(float) * d);
    cpu::compressor_backward(plan.entries.data(), ne_own, c.compress_ratio, spec, rope,
                             s.x_ext.data(), ne, dm, cpu::compressor_weights(w, prefix), st,
                             dentries.data(), cpu::compressor_grads(g, prefix), dx_rows);
  };
  // The main compressor (not detached) on the owned entries.
  if (c.has_compressor()) {
    comp_scatter.wait();
    owned_compressor_backward(cpu::main_compressor_spec(c, false), "attn.compressor.", s.comp,
                              dcomp_slots, dx_ext.data());
  }
  // The indexer compressor: trained by the loss only, no gradient to the hidden rows.
  if (loss_path) {
    idx_scatter.wait();
    owned_compressor_backward(cpu::indexer_compressor_spec(c, false),
                              "attn.indexer.compressor.", s.idx_comp, didx_slots, nullptr);
  }

  // Halo gradients back to the ranks that own the rows.
  return_halo_gradients(comm, plan, dx_ext.data(), dm, dx.data());

  CpLayerGradients out;
  out.grad_input = Tensor::from_f32(dx, {n, dm});
  for (const ParamInfo& p : g.params()) out.grad[p.name] = g.get(p.name);
  const CommStats& after = comm.stats();
  out.backward_comm = {after.bytes_sent - comm_before.bytes_sent,
                       after.bytes_received - comm_before.bytes_received,
                       after.operations - comm_before.operations};
  return out;
}

// ---- device memory in and out (device cuda) ----

namespace {

std::uint64_t layout_checksum_of(const CpPartition& part) {
  return cp::checksum(part.layout().cu_seqlens()) ^ (cp::checksum(part.layout().cu_seqlens_padded()) * 31);
}

}  // namespace

void ContextParallelLayer::forward_device(Communicator& comm, const CpPartition& part,
                                          const void* x_local, const CpDeviceOutputs& out,
                                          void* stream) const {
  std::string local_error;
  if (options_.device != Device::cuda)
    local_error = "forward_device needs a layer on device cuda (RunOptions::device)";
  else if (part.ranks() != comm.size())
    local_error = "the partition is over " + std::to_string(part.ranks()) +
                  " ranks but the communicator has " + std::to_string(comm.size());
  else if ((x_local == nullptr || out.y == nullptr) && part.local_rows(comm.rank()) > 0)
    local_error = "forward_device: x_local and out.y must be device arrays of this rank's rows";
  else if (reinterpret_cast<std::uintptr_t>(x_local) % 4 != 0 || reinterpret_cast<std::uintptr_t>(out.y) % 4 != 0)
    local_error = "forward_device: x_local and out.y must be 4-byte aligned (the rows are read and written "
                  "in place as 32-bit words)";
  agree_forward(comm, part, local_error);
#ifdef CSATTN_HAVE_CUDA
  const BatchGeometry geo = BatchGeometry::build(part.layout(), cfg_.compress_ratio);
  const cp::LayerPlan plan = cp::build_layer_plan(geo, part, comm.rank(), cfg_.window);
  agreed_prepare(comm, "context-parallel forward", [&] { gpu_->prepare_forward(comm, geo, plan, false); });
  gpu_->forward_device(comm, x_local, out.y, out.topk, out.loss, stream);
  device_layout_ = layout_checksum_of(part);
#else
  (void)stream;
#endif
}

void ContextParallelLayer::backward_device(Communicator& comm, const void* dy_local,
                                           float* dx_local, float grad_indexer_loss,
                                           void* stream, const float* grad_indexer_loss_on_device) const {
  std::string local_error;
  if (options_.device != Device::cuda)
    local_error = "backward_device needs a layer on device cuda (RunOptions::device)";
  else if (device_layout_ == 0)
    local_error = "backward_device needs a forward_device of this layer first";
  else if (dy_local == nullptr || dx_local == nullptr)
    local_error = "backward_device: dy_local and dx_local must be device arrays of this rank's rows";
  else if (reinterpret_cast<std::uintptr_t>(dy_local) % 4 != 0 || reinterpret_cast<std::uintptr_t>(dx_local) % 4 != 0)
    local_error = "backward_device: dy_local and dx_local must be 4-byte aligned (read and written in place)";
  else if (!std::isfinite(grad_indexer_loss))
    local_error = "grad_indexer_loss must be finite";
#ifdef CSATTN_HAVE_CUDA
  if (gpu_) gpu_->make_current();
#endif
  cp::agree(comm, "context-parallel backward",
            {{"the layout of the forward", device_layout_},
             {"the layer config", cp::checksum(cfg_)},
             {"the layer weights", weights_checksum_},
             {"the device", static_cast<std::uint64_t>(options_.device)}},
            local_error);
#ifdef CSATTN_HAVE_CUDA
  agreed_prepare(comm, "context-parallel backward", [&] {
    gpu_->prepare_backward(comm, grad_indexer_loss, grad_indexer_loss_on_device);
  });
  gpu_->backward_device(comm, dy_local, dx_local, stream);
#else
  (void)stream;
  (void)grad_indexer_loss_on_device;
#endif
}

std::map<std::string, const float*> ContextParallelLayer::device_gradients() const {
  require(options_.device == Device::cuda, ErrorKind::InvalidArgument,
          "device_gradients needs a layer on device cuda");
#ifdef CSATTN_HAVE_CUDA
  return gpu_->device_gradients();
#else
  return {};
#endif
}

}  // namespace csattn
