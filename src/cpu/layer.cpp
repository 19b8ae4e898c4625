// The CPU backend of HybridAttentionLayer: the whole layer forward and backward (spec 01
// §2-§8), composed from the operators in src/cpu/.
#include "csattn/layer.hpp"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/geometry.hpp"
#include "core/rope_table.hpp"
#include "cpu/attention.hpp"
#include "cpu/blas.hpp"
#include "cpu/compressor.hpp"
#include "cpu/elementwise.hpp"
#include "cpu/indexer_loss.hpp"
#include "cpu/layer_topk.hpp"
#include "csattn/error.hpp"
#ifdef CSATTN_HAVE_CUDA
#include "cuda/cuda_layer.hpp"
#endif

namespace csattn {

const char* precision_name(Precision p) { return p == Precision::bf16 ? "bf16" : "fp32"; }

bool cuda_available(std::string* why) {
#ifdef CSATTN_HAVE_CUDA
  return cuda::device_available(why);
#else
  if (why) *why = "this build has no CUDA backend (nvcc was not found at configure time)";
  return false;
#endif
}

// Everything the backward needs, kept by the forward. Names follow the spec: *_proj are GEMM
// outputs before a norm, the plain names the tensors after it.
struct SavedActivations {
  AttentionConfig cfg;
  BatchGeometry geo;
  bool bf16 = false;
  std::vector<float> x;                      // [T, d_model] (storage-rounded)
  std::vector<float> q_proj, cq, rstd_q;     // [T, r_q]
  std::vector<float> qb_proj, rstd_qh, q;    // [T, H*D], [T*H], [T, H, D] after RoPE
  std::vector<float> kv_proj, rstd_kv, kv;   // [T, D]
  cpu::CompressorState comp;                 // main compressor (m > 1)
  cpu::CompressorState idx_comp;             // indexer compressor (m = 4)
  std::vector<float> qi_proj, qi;            // [T, H_I*D_I] before / after RoPE+Hadamard
  std::vector<float> w_eff;                  // [T, H_I] effective indexer head weights
  std::vector<std::int32_t> topk;            // [T, K]
  std::vector<float> topk_softmax;           // [T, K] compact softmax (sparse-loss predictor)
  std::vector<float> attn, lse;              // [T, H, D] core output, [T, H]
  std::vector<float> attn_rot;               // [T, H*D] after inverse RoPE
  std::vector<float> u;                      // [T, G*r_o]
  std::uint64_t cuda_generation = 0;         // device cuda: which forward's activations
};

namespace {

using cpu::round_to_storage;

std::vector<float> zeros(std::size_t n) { return std::vector<float>(n, 0.0f); }

cpu::RopeTable make_rope(const AttentionConfig& cfg, bool bf16) {
  return cpu::RopeTable{rope_frequencies(cfg), cfg.rope_dim / 2, bf16};
}

// RoPE on the last rope_dim dims of each of `heads` head vectors of width `dim` per row.
void rope_heads(const cpu::RopeTable& rope, const BatchGeometry& geo, float* v, int heads,
                int dim, int rope_dim, int sign) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < geo.rows; ++t)
    for (int h = 0; h < heads; ++h)
      rope.rotate(v + (static_cast<long>(t) * heads + h) * dim + dim - rope_dim,
                  geo.row_position[t], sign);
}

void hadamard_heads(float* v, long vectors, int dim, bool bf16) {
#pragma omp parallel for schedule(static)
  for (long i = 0; i < vectors; ++i) {
    cpu::hadamard(v + i * dim, dim);
    round_to_storage(v + i * dim, dim, bf16);
  }
}

cpu::CompressorSpec main_compressor_spec(const AttentionConfig& cfg, bool bf16) {
  return {cfg.head_dim, cfg.rope_dim, false, static_cast<float>(cfg.norm_eps), bf16};
}
cpu::CompressorSpec indexer_compressor_spec(const AttentionConfig& cfg, bool bf16) {
  return {cfg.index_head_dim, cfg.rope_dim, true, static_cast<float>(cfg.norm_eps), bf16};
}

cpu::CompressorWeights compressor_weights(const LayerWeights& w, const std::string& prefix) {
  return {w.f32(prefix + "wkv.weight"), w.f32(prefix + "wgate.weight"), w.f32(prefix + "ape"),
          w.f32(prefix + "norm.weight")};
}
cpu::CompressorGrads compressor_grads(LayerWeights& g, const std::string& prefix) {
  return {g.f32(prefix + "wkv.weight"), g.f32(prefix + "wgate.weight"), g.f32(prefix + "ape"),
          g.f32(prefix + "norm.weight")};
}

cpu::AttentionArgs attention_args(const SavedActivations& s, const LayerWeights& w) {
  const AttentionConfig& c = s.cfg;
  cpu::AttentionArgs a;
  a.kind = c.kind();
  a.heads = c.n_heads;
  a.dim = c.head_dim;
  a.window = c.window;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  a.q = s.q.data();
  a.kv = s.kv.data();
  a.comp = s.comp.out.data();
  a.sink = w.f32("attn.attn_sink");
  a.topk = s.topk.data();
  a.topk_width = c.has_indexer() ? c.index_topk : 0;
  a.bf16 = s.bf16;
  return a;
}

cpu::LossArgs loss_args(const SavedActivations& s, const LayerWeights& w) {
  const AttentionConfig& c = s.cfg;
  cpu::LossArgs l;
  l.indexer = {c.index_n_heads, c.index_head_dim, c.index_topk, s.qi.data(), s.w_eff.data(),
               s.idx_comp.out.data()};
  l.teacher = {c.n_heads, c.head_dim, c.window,
               static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim))),
               s.q.data(), s.kv.data(), s.comp.out.data(), w.f32("attn.attn_sink")};
  l.topk = s.topk.data();
  l.predict = s.topk_softmax.empty() ? nullptr : s.topk_softmax.data();
  l.sparse = c.sparse_loss;
  l.per_token = c.per_token_loss;
  l.coeff = c.loss_coeff;
  return l;
}

// Grouped low-rank O projection: u[t, g*r_o + r] = sum_d W_oa[g*r_o + r, d] o[t, g, d].
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

// A caller-supplied CSA selection must have the right shape and hold only -1 or entries
// visible to their row (padding rows: none).
void check_forced_topk(const AttentionConfig& c, const SeqLayout& layout, const Tensor& topk) {
  const BatchGeometry geo = BatchGeometry::build(layout, c.compress_ratio);
  const int T = geo.rows, K = c.index_topk;
  require(topk.ndim() == 2 && topk.dim(0) == T && topk.dim(1) == K && topk.dtype() == DType::i32,
          ErrorKind::ShapeMismatch,
          "topk has shape " + shape_str(topk.shape()) + " " + dtype_name(topk.dtype()) +
              ", expected [" + std::to_string(T) + ", " + std::to_string(K) + "] i32");
  const std::int32_t* src = topk.ptr<std::int32_t>();
  for (int t = 0; t < T; ++t) {
    const int vis = geo.row_is_padding[t] ? 0 : geo.visible_compressed(t);
    for (int k = 0; k < K; ++k) {
      const std::int32_t id = src[static_cast<long>(t) * K + k];
      require(id == -1 || (id >= 0 && id < vis), ErrorKind::InvalidArgument,
              "topk[" + std::to_string(t) + ", " + std::to_string(k) + "] = " +
                  std::to_string(id) + " is not -1 or a visible entry (" + std::to_string(vis) +
                  " visible)");
    }
  }
}

struct ThreadScope {  // applies RunOptions::threads for the duration of a call
  int saved = omp_get_max_threads();
  explicit ThreadScope(int n) { if (n > 0) omp_set_num_threads(n); }
  ~ThreadScope() { omp_set_num_threads(saved); }
};

}  // namespace

HybridAttentionLayer::HybridAttentionLayer(AttentionConfig cfg, LayerWeights weights,
                                           RunOptions options)
    : cfg_(cfg), weights_(std::move(weights)), options_(options) {
  cfg_.validate();
  weights_.check(cfg_);
  require(options_.threads >= 0, ErrorKind::InvalidArgument,
          "threads = " + std::to_string(options_.threads) + " must be >= 0");
  if (options_.device == Device::cuda) {
    std::string why;
    require(cuda_available(&why), ErrorKind::Unsupported, "device cuda: " + why);
    require(options_.precision == Precision::bf16, ErrorKind::Unsupported,
            "device cuda computes in bf16 only (fp32 is a CPU reference mode)");
    require(cfg_.indexer_precision == IndexerPrecision::bf16 || !cfg_.has_indexer(),
            ErrorKind::Unsupported,
            "device cuda: the MXFP8 indexer runs on the CPU only so far; use "
            "--indexer-precision bf16 on the GPU");
#ifdef CSATTN_HAVE_CUDA
    cuda_ = std::make_shared<cuda::CudaLayer>(cfg_, weights_);
    cuda_->set_poison(options_.poison_workspace);
#endif
  }
}

LayerOutputs HybridAttentionLayer::forward(const Tensor& x, const SeqLayout& layout) const {
  return forward(x, layout, Tensor());
}

LayerOutputs HybridAttentionLayer::forward(const Tensor& x, const SeqLayout& layout,
                                           const Tensor& forced_topk) const {
  const AttentionConfig& c = cfg_;
  require(x.ndim() == 2 && x.dim(1) == c.d_model, ErrorKind::ShapeMismatch,
          "hidden_states has shape " + shape_str(x.shape()) + ", expected [T, " +
              std::to_string(c.d_model) + "]");
  layout.check_rows(x.dim(0));
  ThreadScope threads(options_.threads);
  const LayerWeights& w = weights_;
  if (c.has_indexer() && !forced_topk.empty()) check_forced_topk(c, layout, forced_topk);
#ifdef CSATTN_HAVE_CUDA
  if (cuda_) {
    LayerOutputs out = cuda_->forward(x, layout, c.has_indexer() ? forced_topk : Tensor());
    auto saved = std::make_shared<SavedActivations>();
    saved->cfg = c;
    saved->cuda_generation = cuda_->generation();
    out.saved = std::move(saved);
    return out;
  }
#endif
  // CPU fp32: batch-invariant products, so every row's forward is the same whatever else is
  // in the batch (context-parallel ranks reproduce it bit for bit; docs/numerics.md).
  const cpu::BatchInvariantScope batch_invariant(options_.precision == Precision::fp32);
  auto s = std::make_shared<SavedActivations>();
  s->cfg = c;
  s->bf16 = options_.precision == Precision::bf16;
  s->geo = BatchGeometry::build(layout, c.compress_ratio);
  const BatchGeometry& geo = s->geo;
  const bool bf16 = s->bf16;
  const int T = geo.rows, H = c.n_heads, D = c.head_dim, dm = c.d_model, rq = c.q_lora_rank;
  const cpu::RopeTable rope = make_rope(c, bf16);

  s->x = x.to_f32();
  round_to_storage(s->x.data(), static_cast<long>(s->x.size()), bf16);

  // Query path: down-projection, RMSNorm, up-projection, weightless per-head RMS, RoPE.
  s->q_proj = zeros(static_cast<std::size_t>(T) * rq);
  cpu::linear(s->x.data(), T, dm, w.f32("attn.wq_a.weight"), rq, s->q_proj.data());
  round_to_storage(s->q_proj.data(), static_cast<long>(s->q_proj.size()), bf16);
  s->cq = zeros(s->q_proj.size());
  s->rstd_q = zeros(static_cast<std::size_t>(T));
  cpu::rmsnorm_forward(s->q_proj.data(), w.f32("attn.q_norm.weight"), T, rq,
                       static_cast<float>(c.norm_eps), s->cq.data(), s->rstd_q.data());
  round_to_storage(s->cq.data(), static_cast<long>(s->cq.size()), bf16);
  s->qb_proj = zeros(static_cast<std::size_t>(T) * H * D);
  cpu::linear(s->cq.data(), T, rq, w.f32("attn.wq_b.weight"), H * D, s->qb_proj.data());
  round_to_storage(s->qb_proj.data(), static_cast<long>(s->qb_proj.size()), bf16);
  s->q = zeros(s->qb_proj.size());
  s->rstd_qh = zeros(static_cast<std::size_t>(T) * H);
  cpu::rmsnorm_forward(s->qb_proj.data(), nullptr, T * H, D, static_cast<float>(c.norm_eps),
                       s->q.data(), s->rstd_qh.data());
  round_to_storage(s->q.data(), static_cast<long>(s->q.size()), bf16);
  rope_heads(rope, geo, s->q.data(), H, D, c.rope_dim, +1);

  // The shared K=V head.
  s->kv_proj = zeros(static_cast<std::size_t>(T) * D);
  cpu::linear(s->x.data(), T, dm, w.f32("attn.wkv.weight"), D, s->kv_proj.data());
  round_to_storage(s->kv_proj.data(), static_cast<long>(s->kv_proj.size()), bf16);
  s->kv = zeros(s->kv_proj.size());
  s->rstd_kv = zeros(static_cast<std::size_t>(T));
  cpu::rmsnorm_forward(s->kv_proj.data(), w.f32("attn.kv_norm.weight"), T, D,
                       static_cast<float>(c.norm_eps), s->kv.data(), s->rstd_kv.data());
  round_to_storage(s->kv.data(), static_cast<long>(s->kv.size()), bf16);
  rope_heads(rope, geo, s->kv.data(), 1, D, c.rope_dim, +1);

  if (c.has_compressor())
    cpu::compressor_forward(geo, main_compressor_spec(c, bf16), rope, s->x.data(), dm,
                            compressor_weights(w, "attn.compressor."), s->comp);

  LayerOutputs out;
  if (c.has_indexer()) {
    // The lightning indexer sees detached inputs (cq and x); nothing flows back from it.
    const int HI = c.index_n_heads, DI = c.index_head_dim, K = c.index_topk;
    s->qi_proj = zeros(static_cast<std::size_t>(T) * HI * DI);
    cpu::linear(s->cq.data(), T, rq, w.f32("attn.indexer.wq_b.weight"), HI * DI,
                s->qi_proj.data());
    round_to_storage(s->qi_proj.data(), static_cast<long>(s->qi_proj.size()), bf16);
    s->qi = s->qi_proj;
    rope_heads(rope, geo, s->qi.data(), HI, DI, c.rope_dim, +1);
    hadamard_heads(s->qi.data(), static_cast<long>(T) * HI, DI, bf16);
    s->w_eff = zeros(static_cast<std::size_t>(T) * HI);
    cpu::linear(s->x.data(), T, dm, w.f32("attn.indexer.weights_proj.weight"), HI,
                s->w_eff.data());
    // w' = ((W x) H_I^-1/2) D_I^-1/2 with a bf16 rounding after each product, as the
    // reference folds the indexer scale into bf16 weights.
    const float head_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HI)));
    const float dim_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(DI)));
    round_to_storage(s->w_eff.data(), static_cast<long>(s->w_eff.size()), bf16);
    for (float& v : s->w_eff) {
      v = bf16 ? round_bf16(v * head_scale) : v * head_scale;
      v = bf16 ? round_bf16(v * dim_scale) : v * dim_scale;
    }
    cpu::compressor_forward(geo, indexer_compressor_spec(c, bf16), rope, s->x.data(), dm,
                            compressor_weights(w, "attn.indexer.compressor."), s->idx_comp);
    s->topk.assign(static_cast<std::size_t>(T) * K, -1);
    if (!forced_topk.empty()) {
      std::memcpy(s->topk.data(), forced_topk.data(), sizeof(std::int32_t) * s->topk.size());
    } else {
      // The compact indexer (bf16 or mxfp8 operands) selects; with a sparse loss its softmax
      // over the selection is also the loss's predictor. A forced selection has none: the
      // loss then recomputes the scores.
      const cpu::IndexerArgs ia{HI, DI, K, s->qi.data(), s->w_eff.data(), s->idx_comp.out.data()};
      const bool want_softmax = c.sparse_loss && c.loss_coeff > 0.0;
      std::vector<float> logits(static_cast<std::size_t>(T) * K);
      if (want_softmax) s->topk_softmax.assign(static_cast<std::size_t>(T) * K, 0.0f);
      cpu::layer_indexer_topk(geo, ia, c.indexer_precision, s->topk.data(), logits.data(),
                              want_softmax ? s->topk_softmax.data() : nullptr);
    }
    out.topk_indices = Tensor(DType::i32, {T, K});
    std::memcpy(out.topk_indices.data(), s->topk.data(), sizeof(std::int32_t) * s->topk.size());
    if (c.loss_coeff > 0.0)
      out.indexer_loss = static_cast<float>(cpu::indexer_loss_forward(geo, loss_args(*s, w)));
  }

  // Sparse attention with the sink, inverse RoPE, grouped O and the final projection.
  s->attn = zeros(static_cast<std::size_t>(T) * H * D);
  s->lse = zeros(static_cast<std::size_t>(T) * H);
  cpu::attention_forward(geo, attention_args(*s, w), s->attn.data(), s->lse.data());
  s->attn_rot = s->attn;
  rope_heads(rope, geo, s->attn_rot.data(), H, D, c.rope_dim, -1);
  const int gro = c.o_groups * c.o_lora_rank;
  s->u = zeros(static_cast<std::size_t>(T) * gro);
  grouped_o_forward(c, T, s->attn_rot.data(), w.f32("attn.wo_a.weight"), s->u.data());
  round_to_storage(s->u.data(), static_cast<long>(s->u.size()), bf16);
  out.output = Tensor(DType::f32, {T, dm});
  cpu::linear(s->u.data(), T, gro, w.f32("attn.wo_b.weight"), dm, out.output.ptr<float>());
  round_to_storage(out.output.ptr<float>(), out.output.numel(), bf16);
  out.saved = std::move(s);
  return out;
}

LayerGradients HybridAttentionLayer::backward(const LayerOutputs& fwd, const Tensor& grad_output,
                                              float grad_indexer_loss) const {
  require(fwd.saved != nullptr, ErrorKind::InvalidArgument,
          "backward needs the outputs of a forward of this layer");
#ifdef CSATTN_HAVE_CUDA
  if (cuda_) {
    require(fwd.saved->cuda_generation == cuda_->generation(), ErrorKind::InvalidArgument,
            "backward on device cuda must follow the forward it differentiates: the GPU keeps "
            "only the last forward's activations");
    require(grad_output.ndim() == 2 && grad_output.dim(0) == fwd.output.dim(0) &&
                grad_output.dim(1) == cfg_.d_model,
            ErrorKind::ShapeMismatch,
            "grad_output has shape " + shape_str(grad_output.shape()) + ", expected [" +
                std::to_string(fwd.output.dim(0)) + ", " + std::to_string(cfg_.d_model) + "]");
    require(std::isfinite(grad_indexer_loss), ErrorKind::InvalidArgument,
            "grad_indexer_loss must be finite");
    return cuda_->backward(grad_output, grad_indexer_loss);
  }
#endif
  const SavedActivations& s = *fwd.saved;
  const AttentionConfig& c = s.cfg;
  const BatchGeometry& geo = s.geo;
  const int T = geo.rows, H = c.n_heads, D = c.head_dim, dm = c.d_model, rq = c.q_lora_rank;
  require(grad_output.ndim() == 2 && grad_output.dim(0) == T && grad_output.dim(1) == dm,
          ErrorKind::ShapeMismatch,
          "grad_output has shape " + shape_str(grad_output.shape()) + ", expected [" +
              std::to_string(T) + ", " + std::to_string(dm) + "]");
  require(std::isfinite(grad_indexer_loss), ErrorKind::InvalidArgument,
          "grad_indexer_loss must be finite");
  ThreadScope threads(options_.threads);
  const LayerWeights& w = weights_;
  LayerWeights g = LayerWeights::zeros(c);
  const cpu::RopeTable rope = make_rope(c, false);  // gradients stay fp32
  const std::vector<float> dy = grad_output.to_f32();
  std::vector<float> dx = zeros(static_cast<std::size_t>(T) * dm);

  // Output projections.
  const int gro = c.o_groups * c.o_lora_rank;
  std::vector<float> du = zeros(static_cast<std::size_t>(T) * gro);
  cpu::linear_grad_input(dy.data(), T, dm, w.f32("attn.wo_b.weight"), gro, du.data(), false);
  cpu::linear_grad_weight(dy.data(), T, dm, s.u.data(), gro, g.f32("attn.wo_b.weight"), true);
  std::vector<float> dattn = zeros(static_cast<std::size_t>(T) * H * D);
  grouped_o_backward(c, T, s.attn_rot.data(), w.f32("attn.wo_a.weight"), du.data(),
                     dattn.data(), g.f32("attn.wo_a.weight"));
  rope_heads(rope, geo, dattn.data(), H, D, c.rope_dim, +1);  // (R^-1)^T = R

  // Core attention.
  std::vector<float> dq = zeros(static_cast<std::size_t>(T) * H * D);
  std::vector<float> dkv = zeros(static_cast<std::size_t>(T) * D);
  std::vector<float> dcomp = zeros(static_cast<std::size_t>(geo.compressed_rows()) * D);
  cpu::attention_backward(geo, attention_args(s, w), s.attn.data(), s.lse.data(), dattn.data(),
                          dq.data(), dkv.data(), dcomp.data(), g.f32("attn.attn_sink"));

  // Query path back to x.
  rope_heads(rope, geo, dq.data(), H, D, c.rope_dim, -1);
  std::vector<float> dqb = zeros(dq.size());
  cpu::rmsnorm_backward(s.qb_proj.data(), nullptr, s.rstd_qh.data(), dq.data(), T * H, D,
                        dqb.data(), nullptr);
  std::vector<float> dcq = zeros(static_cast<std::size_t>(T) * rq);
  cpu::linear_grad_input(dqb.data(), T, H * D, w.f32("attn.wq_b.weight"), rq, dcq.data(), false);
  cpu::linear_grad_weight(dqb.data(), T, H * D, s.cq.data(), rq, g.f32("attn.wq_b.weight"), true);
  std::vector<float> dqa = zeros(dcq.size());
  cpu::rmsnorm_backward(s.q_proj.data(), w.f32("attn.q_norm.weight"), s.rstd_q.data(),
                        dcq.data(), T, rq, dqa.data(), g.f32("attn.q_norm.weight"));
  cpu::linear_grad_input(dqa.data(), T, rq, w.f32("attn.wq_a.weight"), dm, dx.data(), true);
  cpu::linear_grad_weight(dqa.data(), T, rq, s.x.data(), dm, g.f32("attn.wq_a.weight"), true);

  // K=V path back to x.
  rope_heads(rope, geo, dkv.data(), 1, D, c.rope_dim, -1);
  std::vector<float> dkva = zeros(dkv.size());
  cpu::rmsnorm_backward(s.kv_proj.data(), w.f32("attn.kv_norm.weight"), s.rstd_kv.data(),
                        dkv.data(), T, D, dkva.data(), g.f32("attn.kv_norm.weight"));
  cpu::linear_grad_input(dkva.data(), T, D, w.f32("attn.wkv.weight"), dm, dx.data(), true);
  cpu::linear_grad_weight(dkva.data(), T, D, s.x.data(), dm, g.f32("attn.wkv.weight"), true);

  // The main compressor is not detached: the main loss reaches x through it.
  if (c.has_compressor())
    cpu::compressor_backward(geo, main_compressor_spec(c, false), rope, s.x.data(), dm,
                             compressor_weights(w, "attn.compressor."), s.comp, dcomp.data(),
                             compressor_grads(g, "attn.compressor."), dx.data());

  // The indexer is trained only by its loss; its inputs are detached (no dx, no dcq).
  if (c.has_indexer() && c.loss_coeff > 0.0 && grad_indexer_loss != 0.0f) {
    const int HI = c.index_n_heads, DI = c.index_head_dim;
    std::vector<float> dqi = zeros(static_cast<std::size_t>(T) * HI * DI);
    std::vector<float> dweff = zeros(static_cast<std::size_t>(T) * HI);
    std::vector<float> dkeys = zeros(static_cast<std::size_t>(geo.compressed_rows()) * DI);
    cpu::indexer_loss_backward(geo, loss_args(s, w), grad_indexer_loss, dqi.data(),
                               dweff.data(), dkeys.data());
    hadamard_heads(dqi.data(), static_cast<long>(T) * HI, DI, false);
    rope_heads(rope, geo, dqi.data(), HI, DI, c.rope_dim, -1);
    cpu::linear_grad_weight(dqi.data(), T, HI * DI, s.cq.data(), rq,
                            g.f32("attn.indexer.wq_b.weight"), true);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HI)) /
                                           std::sqrt(static_cast<double>(DI)));
    for (float& v : dweff) v *= scale;
    cpu::linear_grad_weight(dweff.data(), T, HI, s.x.data(), dm,
                            g.f32("attn.indexer.weights_proj.weight"), true);
    cpu::compressor_backward(geo, indexer_compressor_spec(c, false), rope, s.x.data(), dm,
                             compressor_weights(w, "attn.indexer.compressor."), s.idx_comp,
                             dkeys.data(), compressor_grads(g, "attn.indexer.compressor."),
                             nullptr);
  }

  LayerGradients out;
  out.grad_input = Tensor::from_f32(dx, {T, dm});
  for (const ParamInfo& p : g.params()) out.grad[p.name] = g.get(p.name);
  return out;
}

}  // namespace csattn
