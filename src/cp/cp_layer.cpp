// ContextParallelLayer: the attention layer of one rank of a context-parallel group (spec 02),
// composed from the same operators as the single-rank layer (src/cpu/), which take explicit
// query rows, index lists and compressor entries. Per layer and rank:
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
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/attention_index.hpp"
#include "core/geometry.hpp"
#include "core/rope_table.hpp"
#include "cp/agreement.hpp"
#include "cp/layer_plan.hpp"
#include "cpu/attention.hpp"
#include "cpu/blas.hpp"
#include "cpu/compressor.hpp"
#include "cpu/elementwise.hpp"
#include "cpu/indexer_loss.hpp"
#include "cpu/layer_topk.hpp"
#include "csattn/cp.hpp"
#include "csattn/error.hpp"

namespace csattn {

struct CpSavedActivations {
  AttentionConfig cfg;
  bool bf16 = false;
  int rank = 0, ranks = 1;
  std::uint64_t layout_checksum = 0;
  BatchGeometry geo;   // global
  cp::LayerPlan plan;  // this rank's
  std::vector<float> x_local, x_ext;         // [local, dm], [ext, dm]
  std::vector<float> q_proj, cq, rstd_q;     // local
  std::vector<float> qb_proj, rstd_qh, q;    // local
  std::vector<float> kv_proj, rstd_kv, kv;   // ext
  cpu::CompressorState comp, idx_comp;       // owned entries over ext rows
  std::vector<float> comp_rank_major;        // [P*C, D] gathered compressed rows
  std::vector<float> comp_seq;               // [Nc, D] sequence-major (teacher)
  std::vector<float> idx_rank_major;         // [P*C, D_I] gathered indexer keys
  std::vector<float> idx_seq;                // [Nc, D_I] sequence-major
  std::vector<float> qi_proj, qi, w_eff;     // local
  std::vector<std::int32_t> topk;            // [local, K]
  std::vector<float> topk_softmax;           // [local, K] compact softmax (sparse-loss predictor)
  AttentionIndex index;                      // local queries -> kv_full rows
  std::vector<float> attn, lse, attn_rot, u;  // local
};

namespace {

using cpu::round_to_storage;

std::vector<float> zeros(std::size_t n) { return std::vector<float>(n, 0.0f); }

struct ThreadScope {  // applies RunOptions::threads for the duration of a call
  int saved = omp_get_max_threads();
  explicit ThreadScope(int n) { if (n > 0) omp_set_num_threads(n); }
  ~ThreadScope() { omp_set_num_threads(saved); }
};

cpu::RopeTable make_rope(const AttentionConfig& cfg, bool bf16) {
  return cpu::RopeTable{rope_frequencies(cfg), cfg.rope_dim / 2, bf16};
}

// RoPE on the last rope_dim dims of every head of the given global rows, at their positions.
void rope_rows(const cpu::RopeTable& rope, const BatchGeometry& geo, const std::vector<int>& rows,
               float* v, int heads, int dim, int rope_dim, int sign) {
  const int n = static_cast<int>(rows.size());
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; ++i)
    for (int h = 0; h < heads; ++h)
      rope.rotate(v + (static_cast<long>(i) * heads + h) * dim + dim - rope_dim,
                  geo.row_position[rows[static_cast<std::size_t>(i)]], sign);
}

void hadamard_heads(float* v, long vectors, int dim, bool bf16) {
#pragma omp parallel for schedule(static)
  for (long i = 0; i < vectors; ++i) {
    cpu::hadamard(v + i * dim, dim);
    round_to_storage(v + i * dim, dim, bf16);
  }
}

cpu::CompressorSpec main_spec(const AttentionConfig& c, bool bf16) {
  return {c.head_dim, c.rope_dim, false, static_cast<float>(c.norm_eps), bf16};
}
cpu::CompressorSpec indexer_spec(const AttentionConfig& c, bool bf16) {
  return {c.index_head_dim, c.rope_dim, true, static_cast<float>(c.norm_eps), bf16};
}
cpu::CompressorWeights compressor_weights(const LayerWeights& w, const std::string& prefix) {
  return {w.f32(prefix + "wkv.weight"), w.f32(prefix + "wgate.weight"), w.f32(prefix + "ape"),
          w.f32(prefix + "norm.weight")};
}
cpu::CompressorGrads compressor_grads(LayerWeights& g, const std::string& prefix) {
  return {g.f32(prefix + "wkv.weight"), g.f32(prefix + "wgate.weight"), g.f32(prefix + "ape"),
          g.f32(prefix + "norm.weight")};
}

float attention_scale(const AttentionConfig& c) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
}

cpu::IndexedAttentionArgs attention_args(const CpSavedActivations& s, const LayerWeights& w) {
  const AttentionConfig& c = s.cfg;
  cpu::IndexedAttentionArgs a;
  a.heads = c.n_heads;
  a.dim = c.head_dim;
  a.scale = attention_scale(c);
  a.q = s.q.data();
  a.kv = {s.kv.data(), static_cast<int>(s.plan.ext_rows.size()),
          c.has_compressor() ? s.comp_rank_major.data() : nullptr,
          c.has_compressor() ? s.plan.ranks * s.plan.slots : 0};
  a.sink = w.f32("attn.attn_sink");
  a.index = s.index.index.data();
  a.width = s.index.width();
  a.bf16 = s.bf16;
  return a;
}

QueryRows local_queries(const CpSavedActivations& s) {
  return {&s.geo, static_cast<int>(s.plan.local_rows.size()), s.plan.local_rows.data(),
          s.plan.local_ext.data()};
}

cpu::LossArgs loss_args(const CpSavedActivations& s, const LayerWeights& w) {
  const AttentionConfig& c = s.cfg;
  cpu::LossArgs l;
  l.indexer = {c.index_n_heads, c.index_head_dim, c.index_topk, s.qi.data(), s.w_eff.data(),
               s.idx_seq.data()};
  l.teacher = {c.n_heads, c.head_dim, c.window, attention_scale(c), s.q.data(), s.kv.data(),
               s.comp_seq.data(), w.f32("attn.attn_sink")};
  l.topk = s.topk.data();
  l.predict = s.topk_softmax.empty() ? nullptr : s.topk_softmax.data();
  l.sparse = c.sparse_loss;
  l.per_token = c.per_token_loss;
  l.coeff = c.loss_coeff;
  return l;
}

void grouped_o_forward(const AttentionConfig& c, int T, const float* o, const float* woa,
                       float* u) {
  const int G = c.o_groups, ro = c.o_lora_rank, gd = c.n_heads * c.head_dim / G;
  const int hd = c.n_heads * c.head_dim;
  for (int g = 0; g < G; ++g)
    cpu::gemm(false, true, T, ro, gd, 1.0f, o + static_cast<long>(g) * gd, hd,
              woa + static_cast<long>(g) * ro * gd, gd, 0.0f, u + static_cast<long>(g) * ro,
              G * ro);
}

void grouped_o_backward(const AttentionConfig& c, int T, const float* o, const float* woa,
                        const float* du, float* dO, float* dwoa) {
  const int G = c.o_groups, ro = c.o_lora_rank, gd = c.n_heads * c.head_dim / G;
  const int hd = c.n_heads * c.head_dim;
  for (int g = 0; g < G; ++g) {
    cpu::gemm(false, false, T, gd, ro, 1.0f, du + static_cast<long>(g) * ro, G * ro,
              woa + static_cast<long>(g) * ro * gd, gd, 0.0f, dO + static_cast<long>(g) * gd,
              hd);
    cpu::gemm(true, false, ro, gd, T, 1.0f, du + static_cast<long>(g) * ro, G * ro,
              o + static_cast<long>(g) * gd, hd, 1.0f, dwoa + static_cast<long>(g) * ro * gd,
              gd);
  }
}

// Forward halo exchange: x_ext gets the local rows and the halo rows from their owners.
void exchange_halo(Communicator& comm, const cp::LayerPlan& plan, const float* x_local,
                   int cols, float* x_ext) {
  const std::size_t row_bytes = sizeof(float) * static_cast<std::size_t>(cols);
  for (std::size_t e = 0; e < plan.ext_rows.size(); ++e)
    if (plan.ext_local[e] >= 0)
      std::memcpy(x_ext + e * cols, x_local + static_cast<std::size_t>(plan.ext_local[e]) * cols,
                  row_bytes);
  std::vector<std::vector<float>> send_buf, recv_buf;
  std::vector<P2PMessage> sends, recvs;
  for (const cp::HaloTransfer& t : plan.halo_send) {
    std::vector<float>& b = send_buf.emplace_back(t.rows.size() * static_cast<std::size_t>(cols));
    for (std::size_t i = 0; i < t.rows.size(); ++i)
      std::memcpy(b.data() + i * cols, x_local + static_cast<std::size_t>(t.rows[i]) * cols,
                  row_bytes);
  }
  for (std::size_t k = 0; k < plan.halo_send.size(); ++k)
    sends.push_back({plan.halo_send[k].peer, comm_buffer(send_buf[k].data(), send_buf[k].size())});
  for (const cp::HaloTransfer& t : plan.halo_receive)
    recv_buf.emplace_back(t.rows.size() * static_cast<std::size_t>(cols));
  for (std::size_t k = 0; k < plan.halo_receive.size(); ++k)
    recvs.push_back({plan.halo_receive[k].peer,
                     comm_buffer(recv_buf[k].data(), recv_buf[k].size())});
  comm.exchange(sends, recvs).wait();
  for (std::size_t k = 0; k < plan.halo_receive.size(); ++k) {
    const cp::HaloTransfer& t = plan.halo_receive[k];
    for (std::size_t i = 0; i < t.rows.size(); ++i)
      std::memcpy(x_ext + static_cast<std::size_t>(t.rows[i]) * cols,
                  recv_buf[k].data() + i * cols, row_bytes);
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
  std::vector<std::vector<float>> send_buf, recv_buf;
  std::vector<P2PMessage> sends, recvs;
  for (const cp::HaloTransfer& t : plan.halo_receive) {  // my halo rows go back
    std::vector<float>& b = send_buf.emplace_back(t.rows.size() * static_cast<std::size_t>(cols));
    for (std::size_t i = 0; i < t.rows.size(); ++i)
      std::memcpy(b.data() + i * cols, dx_ext + static_cast<std::size_t>(t.rows[i]) * cols,
                  sizeof(float) * cols);
  }
  for (std::size_t k = 0; k < plan.halo_receive.size(); ++k)
    sends.push_back({plan.halo_receive[k].peer,
                     comm_buffer(send_buf[k].data(), send_buf[k].size())});
  for (const cp::HaloTransfer& t : plan.halo_send)
    recv_buf.emplace_back(t.rows.size() * static_cast<std::size_t>(cols));
  for (std::size_t k = 0; k < plan.halo_send.size(); ++k)
    recvs.push_back({plan.halo_send[k].peer, comm_buffer(recv_buf[k].data(), recv_buf[k].size())});
  comm.exchange(sends, recvs).wait();
  for (std::size_t k = 0; k < plan.halo_send.size(); ++k) {
    const cp::HaloTransfer& t = plan.halo_send[k];
    for (std::size_t i = 0; i < t.rows.size(); ++i) {
      float* dst = dx_local + static_cast<std::size_t>(t.rows[i]) * cols;
      const float* src = recv_buf[k].data() + i * cols;
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

}  // namespace

ContextParallelLayer::ContextParallelLayer(AttentionConfig cfg, LayerWeights weights,
                                           RunOptions options, CpLayerOptions cp_options)
    : cfg_(cfg), weights_(std::move(weights)), options_(options), cp_options_(cp_options) {
  cfg_.validate();
  weights_.check(cfg_);
  require(options_.device == Device::cpu, ErrorKind::Unsupported,
          "context parallelism runs on device cpu only so far (the CUDA backend is "
          "single-rank): use device cpu");
  require(options_.threads >= 0, ErrorKind::InvalidArgument,
          "threads = " + std::to_string(options_.threads) + " must be >= 0");
  weights_checksum_ = cp::checksum(weights_);
}

int ContextParallelLayer::halo_rows() const {
  return cp::halo_width(cfg_.window, cfg_.compress_ratio);
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
  cp::agree(comm, "context-parallel forward",
            {{"cu_seqlens", cp::checksum(part.layout().cu_seqlens())},
             {"cu_seqlens_padded", cp::checksum(part.layout().cu_seqlens_padded())},
             {"the partition mode", static_cast<std::uint64_t>(part.mode())},
             {"the layer config", cp::checksum(c)},
             {"the layer weights", weights_checksum_},
             {"the precision", static_cast<std::uint64_t>(options_.precision)}},
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

  ThreadScope threads(options_.threads);
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
  const int H = c.n_heads, D = c.head_dim, dm = c.d_model, rq = c.q_lora_rank;
  const cpu::RopeTable rope = make_rope(c, bf16);
  const float eps = static_cast<float>(c.norm_eps);

  s->x_local = x_local.to_f32();
  round_to_storage(s->x_local.data(), static_cast<long>(s->x_local.size()), bf16);
  s->x_ext.assign(static_cast<std::size_t>(ne) * dm,
                  cp_options_.poison_unused ? std::numeric_limits<float>::quiet_NaN() : 0.0f);
  exchange_halo(comm, plan, s->x_local.data(), dm, s->x_ext.data());

  // Query path on the local rows.
  s->q_proj = zeros(static_cast<std::size_t>(n) * rq);
  cpu::linear(s->x_local.data(), n, dm, w.f32("attn.wq_a.weight"), rq, s->q_proj.data());
  round_to_storage(s->q_proj.data(), static_cast<long>(s->q_proj.size()), bf16);
  s->cq = zeros(s->q_proj.size());
  s->rstd_q = zeros(static_cast<std::size_t>(n));
  cpu::rmsnorm_forward(s->q_proj.data(), w.f32("attn.q_norm.weight"), n, rq, eps, s->cq.data(),
                       s->rstd_q.data());
  round_to_storage(s->cq.data(), static_cast<long>(s->cq.size()), bf16);
  s->qb_proj = zeros(static_cast<std::size_t>(n) * H * D);
  cpu::linear(s->cq.data(), n, rq, w.f32("attn.wq_b.weight"), H * D, s->qb_proj.data());
  round_to_storage(s->qb_proj.data(), static_cast<long>(s->qb_proj.size()), bf16);
  s->q = zeros(s->qb_proj.size());
  s->rstd_qh = zeros(static_cast<std::size_t>(n) * H);
  cpu::rmsnorm_forward(s->qb_proj.data(), nullptr, n * H, D, eps, s->q.data(), s->rstd_qh.data());
  round_to_storage(s->q.data(), static_cast<long>(s->q.size()), bf16);
  rope_rows(rope, geo, plan.local_rows, s->q.data(), H, D, c.rope_dim, +1);

  // K=V on the halo + local rows (boundary K=V recomputed here from the received rows).
  s->kv_proj = zeros(static_cast<std::size_t>(ne) * D);
  cpu::linear(s->x_ext.data(), ne, dm, w.f32("attn.wkv.weight"), D, s->kv_proj.data());
  round_to_storage(s->kv_proj.data(), static_cast<long>(s->kv_proj.size()), bf16);
  s->kv = zeros(s->kv_proj.size());
  s->rstd_kv = zeros(static_cast<std::size_t>(ne));
  cpu::rmsnorm_forward(s->kv_proj.data(), w.f32("attn.kv_norm.weight"), ne, D, eps, s->kv.data(),
                       s->rstd_kv.data());
  round_to_storage(s->kv.data(), static_cast<long>(s->kv.size()), bf16);
  rope_rows(rope, geo, plan.ext_rows, s->kv.data(), 1, D, c.rope_dim, +1);

  // Compressed rows: the owned groups, into this rank's slots, all-gathered rank-major. The
  // indexer keys go first (spec 02 §9), both gathers overlap the work that follows.
  const int ne_own = static_cast<int>(plan.entries.size());
  const int HI = c.index_n_heads, DI = c.index_head_dim, K = c.index_topk;
  std::vector<float> comp_slots, idx_slots;
  CommRequest idx_gather, comp_gather;
  if (c.has_indexer()) {
    // The indexer compressor sees the hidden rows detached: its backward gives no dx.
    cpu::compressor_forward(plan.entries.data(), ne_own, c.compress_ratio, indexer_spec(c, bf16),
                            rope, s->x_ext.data(), ne, dm,
                            compressor_weights(w, "attn.indexer.compressor."), s->idx_comp);
    idx_slots = fill_slots(plan, s->idx_comp.out, DI, cp_options_.poison_unused);
    s->idx_rank_major.assign(static_cast<std::size_t>(P) * plan.slots * DI, 0.0f);
    idx_gather = comm.all_gather(comm_buffer(idx_slots.data(), idx_slots.size()),
                                 comm_buffer(s->idx_rank_major.data(), s->idx_rank_major.size()));
  }
  if (c.has_compressor()) {
    cpu::compressor_forward(plan.entries.data(), ne_own, c.compress_ratio, main_spec(c, bf16),
                            rope, s->x_ext.data(), ne, dm,
                            compressor_weights(w, "attn.compressor."), s->comp);
    comp_slots = fill_slots(plan, s->comp.out, D, cp_options_.poison_unused);
    s->comp_rank_major.assign(static_cast<std::size_t>(P) * plan.slots * D, 0.0f);
    comp_gather = comm.all_gather(comm_buffer(comp_slots.data(), comp_slots.size()),
                                  comm_buffer(s->comp_rank_major.data(), s->comp_rank_major.size()));
  }

  CpLayerOutputs out;
  const QueryRows queries = local_queries(*s);
  if (c.has_indexer()) {
    // Indexer queries and head weights on the local rows (detached inputs cq and x).
    s->qi_proj = zeros(static_cast<std::size_t>(n) * HI * DI);
    cpu::linear(s->cq.data(), n, rq, w.f32("attn.indexer.wq_b.weight"), HI * DI,
                s->qi_proj.data());
    round_to_storage(s->qi_proj.data(), static_cast<long>(s->qi_proj.size()), bf16);
    s->qi = s->qi_proj;
    rope_rows(rope, geo, plan.local_rows, s->qi.data(), HI, DI, c.rope_dim, +1);
    hadamard_heads(s->qi.data(), static_cast<long>(n) * HI, DI, bf16);
    s->w_eff = zeros(static_cast<std::size_t>(n) * HI);
    cpu::linear(s->x_local.data(), n, dm, w.f32("attn.indexer.weights_proj.weight"), HI,
                s->w_eff.data());
    const float head_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HI)));
    const float dim_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(DI)));
    round_to_storage(s->w_eff.data(), static_cast<long>(s->w_eff.size()), bf16);
    for (float& v : s->w_eff) {
      v = bf16 ? round_bf16(v * head_scale) : v * head_scale;
      v = bf16 ? round_bf16(v * dim_scale) : v * dim_scale;
    }
    // Top-k: the compact indexer of the single-rank layer (bf16 or mxfp8 operands), the local
    // queries scoring their sequence's keys at their global positions (causal offsets); with
    // a sparse loss its softmax over the selection is also the loss's predictor.
    idx_gather.wait();
    s->idx_seq = sequence_major(plan, geo, s->idx_rank_major, DI);
    s->topk.assign(static_cast<std::size_t>(n) * K, -1);
    const cpu::IndexerArgs ia{HI, DI, K, s->qi.data(), s->w_eff.data(), s->idx_seq.data()};
    const bool want_softmax = c.sparse_loss && c.loss_coeff > 0.0;
    std::vector<float> logits(static_cast<std::size_t>(n) * K);
    if (want_softmax) s->topk_softmax.assign(static_cast<std::size_t>(n) * K, 0.0f);
    cpu::layer_indexer_topk(queries, ia, c.indexer_precision, s->topk.data(), logits.data(),
                            want_softmax ? s->topk_softmax.data() : nullptr);
    out.topk_indices = Tensor(DType::i32, {n, K});
    std::memcpy(out.topk_indices.data(), s->topk.data(), sizeof(std::int32_t) * s->topk.size());
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
  s->index = build_attention_index(queries,
                                   c.has_indexer() ? IndexMode::selected : IndexMode::all_visible,
                                   c.window, cw, c.has_indexer() ? s->topk.data() : nullptr, low);

  s->attn = zeros(static_cast<std::size_t>(n) * H * D);
  s->lse = zeros(static_cast<std::size_t>(n) * H);
  cpu::attention_forward(n, attention_args(*s, w), s->attn.data(), s->lse.data());
  s->attn_rot = s->attn;
  rope_rows(rope, geo, plan.local_rows, s->attn_rot.data(), H, D, c.rope_dim, -1);
  const int gro = c.o_groups * c.o_lora_rank;
  s->u = zeros(static_cast<std::size_t>(n) * gro);
  grouped_o_forward(c, n, s->attn_rot.data(), w.f32("attn.wo_a.weight"), s->u.data());
  round_to_storage(s->u.data(), static_cast<long>(s->u.size()), bf16);
  out.output = Tensor(DType::f32, {n, dm});
  cpu::linear(s->u.data(), n, gro, w.f32("attn.wo_b.weight"), dm, out.output.ptr<float>());
  round_to_storage(out.output.ptr<float>(), out.output.numel(), bf16);

  // Work and traffic of this rank.
  CpWork& work = out.work;
  work.local_rows = n;
  work.halo_rows = ne - n;
  work.owned_compressed = ne_own;
  work.compressed_slots = plan.slots;
  for (int i = 0; i < n; ++i) work.attention_pairs += s->index.length[static_cast<std::size_t>(i)];
  work.attention_flops = 4.0 * H * D * static_cast<double>(work.attention_pairs);
  if (c.has_indexer())
    for (int g : plan.local_rows)
      if (!geo.row_is_padding[g]) work.indexer_pairs += geo.visible_compressed(g);
  const CommStats& after = comm.stats();
  work.forward_comm = {after.bytes_sent - comm_before.bytes_sent,
                       after.bytes_received - comm_before.bytes_received,
                       after.operations - comm_before.operations};
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
  }
  cp::agree(comm, "context-parallel backward",
            {{"the layout of the forward", layout_sum},
             {"the layer config", cp::checksum(c)},
             {"the layer weights", weights_checksum_}},
            local_error);

  ThreadScope threads(options_.threads);
  const CpSavedActivations& s = *fwd.saved;
  const BatchGeometry& geo = s.geo;
  const cp::LayerPlan& plan = s.plan;
  const int P = s.ranks;
  const int n = static_cast<int>(plan.local_rows.size());
  const int ne = static_cast<int>(plan.ext_rows.size());
  const int H = c.n_heads, D = c.head_dim, dm = c.d_model, rq = c.q_lora_rank;
  const LayerWeights& w = weights_;
  LayerWeights g = LayerWeights::zeros(c);
  const cpu::RopeTable rope = make_rope(c, false);  // gradients stay fp32
  const std::vector<float> dy = grad_output.to_f32();
  std::vector<float> dx = zeros(static_cast<std::size_t>(n) * dm);
  std::vector<float> dx_ext = zeros(static_cast<std::size_t>(ne) * dm);

  // Output projections.
  const int gro = c.o_groups * c.o_lora_rank;
  std::vector<float> du = zeros(static_cast<std::size_t>(n) * gro);
  cpu::linear_grad_input(dy.data(), n, dm, w.f32("attn.wo_b.weight"), gro, du.data(), false);
  cpu::linear_grad_weight(dy.data(), n, dm, s.u.data(), gro, g.f32("attn.wo_b.weight"), true);
  std::vector<float> dattn = zeros(static_cast<std::size_t>(n) * H * D);
  grouped_o_backward(c, n, s.attn_rot.data(), w.f32("attn.wo_a.weight"), du.data(),
                     dattn.data(), g.f32("attn.wo_a.weight"));
  rope_rows(rope, geo, plan.local_rows, dattn.data(), H, D, c.rope_dim, +1);

  // Attention: gradients of the local queries and of every kv_full row.
  const int comp_rows = c.has_compressor() ? P * plan.slots : 0;
  std::vector<float> dq = zeros(static_cast<std::size_t>(n) * H * D);
  std::vector<float> dkv = zeros(static_cast<std::size_t>(ne) * D);
  std::vector<float> dcomp_rank_major = zeros(static_cast<std::size_t>(comp_rows) * D);
  cpu::attention_backward(n, attention_args(s, w), s.attn.data(), s.lse.data(), dattn.data(),
                          dq.data(), dkv.data(), dcomp_rank_major.data(),
                          g.f32("attn.attn_sink"));

  // Compressed-KV gradients to their owners (posted first, spec 02 §9).
  std::vector<float> dcomp_slots;
  CommRequest comp_scatter;
  if (c.has_compressor()) {
    dcomp_slots = zeros(static_cast<std::size_t>(plan.slots) * D);
    comp_scatter = comm.reduce_scatter_sum(
        comm_buffer(dcomp_rank_major.data(), dcomp_rank_major.size()),
        comm_buffer(dcomp_slots.data(), dcomp_slots.size()));
  }

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
      cpu::indexer_loss_backward(local_queries(s), loss_args(s, w), grad_indexer_loss,
                                 dqi.data(), dweff.data(), dkeys.data());
    didx_rank_major = zeros(static_cast<std::size_t>(P) * plan.slots * DI);
    for (int j = 0; j < geo.compressed_rows(); ++j) {
      float* dst = didx_rank_major.data() + static_cast<std::size_t>(plan.seq_to_rank_row[j]) * DI;
      const float* src = dkeys.data() + static_cast<std::size_t>(j) * DI;
      for (int d = 0; d < DI; ++d) dst[d] += src[d];
    }
    didx_slots = zeros(static_cast<std::size_t>(plan.slots) * DI);
    idx_scatter = comm.reduce_scatter_sum(
        comm_buffer(didx_rank_major.data(), didx_rank_major.size()),
        comm_buffer(didx_slots.data(), didx_slots.size()));
    hadamard_heads(dqi.data(), static_cast<long>(n) * HI, DI, false);
    rope_rows(rope, geo, plan.local_rows, dqi.data(), HI, DI, c.rope_dim, -1);
    cpu::linear_grad_weight(dqi.data(), n, HI * DI, s.cq.data(), rq,
                            g.f32("attn.indexer.wq_b.weight"), true);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HI)) /
                                           std::sqrt(static_cast<double>(DI)));
    for (float& v : dweff) v *= scale;
    cpu::linear_grad_weight(dweff.data(), n, HI, s.x_local.data(), dm,
                            g.f32("attn.indexer.weights_proj.weight"), true);
  }

  // Query path back to the local rows.
  rope_rows(rope, geo, plan.local_rows, dq.data(), H, D, c.rope_dim, -1);
  std::vector<float> dqb = zeros(dq.size());
  cpu::rmsnorm_backward(s.qb_proj.data(), nullptr, s.rstd_qh.data(), dq.data(), n * H, D,
                        dqb.data(), nullptr);
  std::vector<float> dcq = zeros(static_cast<std::size_t>(n) * rq);
  cpu::linear_grad_input(dqb.data(), n, H * D, w.f32("attn.wq_b.weight"), rq, dcq.data(), false);
  cpu::linear_grad_weight(dqb.data(), n, H * D, s.cq.data(), rq, g.f32("attn.wq_b.weight"), true);
  std::vector<float> dqa = zeros(dcq.size());
  cpu::rmsnorm_backward(s.q_proj.data(), w.f32("attn.q_norm.weight"), s.rstd_q.data(),
                        dcq.data(), n, rq, dqa.data(), g.f32("attn.q_norm.weight"));
  cpu::linear_grad_input(dqa.data(), n, rq, w.f32("attn.wq_a.weight"), dm, dx.data(), true);
  cpu::linear_grad_weight(dqa.data(), n, rq, s.x_local.data(), dm, g.f32("attn.wq_a.weight"), true);

  // K=V path back to the halo + local rows.
  rope_rows(rope, geo, plan.ext_rows, dkv.data(), 1, D, c.rope_dim, -1);
  std::vector<float> dkva = zeros(dkv.size());
  cpu::rmsnorm_backward(s.kv_proj.data(), w.f32("attn.kv_norm.weight"), s.rstd_kv.data(),
                        dkv.data(), ne, D, dkva.data(), g.f32("attn.kv_norm.weight"));
  cpu::linear_grad_input(dkva.data(), ne, D, w.f32("attn.wkv.weight"), dm, dx_ext.data(), true);
  cpu::linear_grad_weight(dkva.data(), ne, D, s.x_ext.data(), dm, g.f32("attn.wkv.weight"), true);

  // The main compressor (not detached) on the owned entries.
  const int ne_own = static_cast<int>(plan.entries.size());
  if (c.has_compressor()) {
    comp_scatter.wait();
    std::vector<float> dentries(static_cast<std::size_t>(ne_own) * D);
    for (int k = 0; k < ne_own; ++k)
      std::memcpy(dentries.data() + static_cast<std::size_t>(k) * D,
                  dcomp_slots.data() + static_cast<std::size_t>(plan.entry_slot[k]) * D,
                  sizeof(float) * D);
    cpu::compressor_backward(plan.entries.data(), ne_own, c.compress_ratio, main_spec(c, false),
                             rope, s.x_ext.data(), ne, dm,
                             compressor_weights(w, "attn.compressor."), s.comp, dentries.data(),
                             compressor_grads(g, "attn.compressor."), dx_ext.data());
  }
  // The indexer compressor: trained by the loss only, no gradient to the hidden rows.
  if (loss_path) {
    idx_scatter.wait();
    std::vector<float> dentries(static_cast<std::size_t>(ne_own) * DI);
    for (int k = 0; k < ne_own; ++k)
      std::memcpy(dentries.data() + static_cast<std::size_t>(k) * DI,
                  didx_slots.data() + static_cast<std::size_t>(plan.entry_slot[k]) * DI,
                  sizeof(float) * DI);
    cpu::compressor_backward(plan.entries.data(), ne_own, c.compress_ratio,
                             indexer_spec(c, false), rope, s.x_ext.data(), ne, dm,
                             compressor_weights(w, "attn.indexer.compressor."), s.idx_comp,
                             dentries.data(), compressor_grads(g, "attn.indexer.compressor."),
                             nullptr);
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

}  // namespace csattn
