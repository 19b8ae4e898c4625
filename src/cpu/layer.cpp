// The CPU backend of HybridAttentionLayer: the whole layer forward and backward (spec 01
// §2-§8), composed from the operators in src/cpu/ through the stages it shares with the
// context-parallel layer (cpu/layer_ops.hpp).
#include "csattn/layer.hpp"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/geometry.hpp"
#include "core/run_options_check.hpp"
#include "cpu/attention.hpp"
#include "cpu/blas.hpp"
#include "cpu/compressor.hpp"
#include "cpu/elementwise.hpp"
#include "cpu/indexer_loss.hpp"
#include "cpu/layer_ops.hpp"
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
  cpu::QueryPath query;                      // [T, ...]
  cpu::KvPath kv;                            // [T, D]
  cpu::CompressorState comp;                 // main compressor (m > 1)
  cpu::CompressorState idx_comp;             // indexer compressor (m = 4)
  cpu::IndexerPath indexer;                  // [T, ...] queries, head weights, top-k
  std::vector<float> attn, lse;              // [T, H, D] core output, [T, H]
  std::vector<float> attn_rot;               // [T, H*D] after inverse RoPE
  std::vector<float> u;                      // [T, G*r_o]
  std::uint64_t cuda_generation = 0;         // device cuda: which forward's activations
};

namespace {

using cpu::round_to_storage;
using cpu::zeros;

cpu::AttentionArgs attention_args(const SavedActivations& s, const LayerWeights& w) {
  const AttentionConfig& c = s.cfg;
  cpu::AttentionArgs a;
  a.kind = c.kind();
  a.heads = c.n_heads;
  a.dim = c.head_dim;
  a.window = c.window;
  a.scale = cpu::attention_scale(c);
  a.q = s.query.q.data();
  a.kv = s.kv.kv.data();
  a.comp = s.comp.out.data();
  a.sink = w.f32("attn.attn_sink");
  a.topk = s.indexer.topk.data();
  a.topk_width = c.has_indexer() ? c.index_topk : 0;
  a.bf16 = s.bf16;
  return a;
}

cpu::LossArgs loss_args(const SavedActivations& s, const LayerWeights& w) {
  return cpu::loss_args(s.cfg, w, s.indexer, s.idx_comp.out.data(), s.query.q.data(),
                        s.kv.kv.data(), s.comp.out.data());
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

}  // namespace

HybridAttentionLayer::HybridAttentionLayer(AttentionConfig cfg, LayerWeights weights,
                                           RunOptions options)
    : cfg_(cfg), weights_(std::move(weights)), options_(options) {
  cfg_.validate();
  weights_.check(cfg_);
  check_run_options(options_);
  if (options_.device == Device::cuda) {
#ifdef CSATTN_HAVE_CUDA
    cuda_ = std::make_shared<cuda::CudaLayer>(cfg_, weights_);
    cuda_->set_poison(options_.poison_workspace);
    cuda_->set_deterministic(options_.deterministic);
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
  cpu::ThreadScope threads(options_.threads);
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
  const int T = geo.rows, dm = c.d_model;
  const QueryRows rows = QueryRows::all(geo);
  const cpu::RopeTable rope = cpu::make_rope(c, bf16);

  s->x = x.to_f32();
  round_to_storage(s->x.data(), static_cast<long>(s->x.size()), bf16);

  // Query path, the shared K=V head and the main compressor.
  cpu::query_forward(c, w, rope, rows, s->x.data(), bf16, s->query);
  cpu::kv_forward(c, w, rope, rows, s->x.data(), bf16, s->kv);
  if (c.has_compressor())
    cpu::compressor_forward(geo, cpu::main_compressor_spec(c, bf16), rope, s->x.data(), dm,
                            cpu::compressor_weights(w, "attn.compressor."), s->comp);

  LayerOutputs out;
  if (c.has_indexer()) {
    // The lightning indexer sees detached inputs (cq and x); nothing flows back from it.
    const int K = c.index_topk;
    cpu::indexer_query_forward(c, w, rope, rows, s->query.cq.data(), s->x.data(), bf16,
                               s->indexer);
    cpu::compressor_forward(geo, cpu::indexer_compressor_spec(c, bf16), rope, s->x.data(), dm,
                            cpu::compressor_weights(w, "attn.indexer.compressor."), s->idx_comp);
    std::vector<std::int32_t>& topk = s->indexer.topk;
    if (!forced_topk.empty()) {
      // A forced selection has no compact softmax: the loss then recomputes the scores.
      topk.assign(static_cast<std::size_t>(T) * K, -1);
      std::memcpy(topk.data(), forced_topk.data(), sizeof(std::int32_t) * topk.size());
    } else {
      cpu::indexer_select(c, rows, s->idx_comp.out.data(), s->indexer);
    }
    out.topk_indices = Tensor(DType::i32, {T, K});
    std::memcpy(out.topk_indices.data(), topk.data(), sizeof(std::int32_t) * topk.size());
    if (c.loss_coeff > 0.0)
      out.indexer_loss = static_cast<float>(cpu::indexer_loss_forward(geo, loss_args(*s, w)));
  }

  // Sparse attention with the sink, inverse RoPE, grouped O and the final projection.
  s->attn = zeros(static_cast<std::size_t>(T) * c.n_heads * c.head_dim);
  s->lse = zeros(static_cast<std::size_t>(T) * c.n_heads);
  cpu::attention_forward(geo, attention_args(*s, w), s->attn.data(), s->lse.data());
  out.output = cpu::output_forward(c, w, rope, rows, s->attn, bf16, s->attn_rot, s->u);
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
  const int T = geo.rows, dm = c.d_model;
  require(grad_output.ndim() == 2 && grad_output.dim(0) == T && grad_output.dim(1) == dm,
          ErrorKind::ShapeMismatch,
          "grad_output has shape " + shape_str(grad_output.shape()) + ", expected [" +
              std::to_string(T) + ", " + std::to_string(dm) + "]");
  require(std::isfinite(grad_indexer_loss), ErrorKind::InvalidArgument,
          "grad_indexer_loss must be finite");
  cpu::ThreadScope threads(options_.threads);
  const LayerWeights& w = weights_;
  LayerWeights g = LayerWeights::zeros(c);
  const QueryRows rows = QueryRows::all(geo);
  const cpu::RopeTable rope = cpu::make_rope(c, false);  // gradients stay fp32
  const std::vector<float> dy = grad_output.to_f32();
  std::vector<float> dx = zeros(static_cast<std::size_t>(T) * dm);

  // Output projections.
  std::vector<float> dattn = cpu::output_backward(c, w, rope, rows, s.attn_rot, s.u, dy.data(), g);

  // Core attention.
  std::vector<float> dq = zeros(static_cast<std::size_t>(T) * c.n_heads * c.head_dim);
  std::vector<float> dkv = zeros(static_cast<std::size_t>(T) * c.head_dim);
  std::vector<float> dcomp = zeros(static_cast<std::size_t>(geo.compressed_rows()) * c.head_dim);
  cpu::attention_backward(geo, attention_args(s, w), s.attn.data(), s.lse.data(), dattn.data(),
                          dq.data(), dkv.data(), dcomp.data(), g.f32("attn.attn_sink"));

  // Query path and K=V path back to x.
  cpu::query_backward(c, w, rope, rows, s.query, s.x.data(), dq, g, dx.data());
  cpu::kv_backward(c, w, rope, rows, s.kv, s.x.data(), dkv, g, dx.data());

  // The main compressor is not detached: the main loss reaches x through it.
  if (c.has_compressor())
    cpu::compressor_backward(geo, cpu::main_compressor_spec(c, false), rope, s.x.data(), dm,
                             cpu::compressor_weights(w, "attn.compressor."), s.comp,
                             dcomp.data(), cpu::compressor_grads(g, "attn.compressor."),
                             dx.data());

  // The indexer is trained only by its loss; its inputs are detached (no dx, no dcq).
  if (c.has_indexer() && c.loss_coeff > 0.0 && grad_indexer_loss != 0.0f) {
    const int HI = c.index_n_heads, DI = c.index_head_dim;
    std::vector<float> dqi = zeros(static_cast<std::size_t>(T) * HI * DI);
    std::vector<float> dweff = zeros(static_cast<std::size_t>(T) * HI);
    std::vector<float> dkeys = zeros(static_cast<std::size_t>(geo.compressed_rows()) * DI);
    cpu::indexer_loss_backward(geo, loss_args(s, w), grad_indexer_loss, dqi.data(),
                               dweff.data(), dkeys.data());
    cpu::indexer_query_backward(c, rope, rows, s.query.cq.data(), s.x.data(), dqi, dweff, g);
    cpu::compressor_backward(geo, cpu::indexer_compressor_spec(c, false), rope, s.x.data(), dm,
                             cpu::compressor_weights(w, "attn.indexer.compressor."), s.idx_comp,
                             dkeys.data(), cpu::compressor_grads(g, "attn.indexer.compressor."),
                             nullptr);
  }

  LayerGradients out;
  out.grad_input = Tensor::from_f32(dx, {T, dm});
  for (const ParamInfo& p : g.params()) out.grad[p.name] = g.get(p.name);
  return out;
}

}  // namespace csattn
