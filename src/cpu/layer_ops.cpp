// The shared stages of the CPU layer composition (see layer_ops.hpp).
#include "cpu/layer_ops.hpp"

#include <omp.h>

#include <cmath>

#include "core/rope_table.hpp"
#include "cpu/blas.hpp"
#include "cpu/layer_topk.hpp"

namespace csattn::cpu {

namespace {

// RoPE on the last rope_dim dims of each of `heads` head vectors of width `dim` of every row,
// at the row's position.
void rope_heads(const RopeTable& rope, const QueryRows& rows, float* v, int heads, int dim,
                int rope_dim, int sign) {
  const BatchGeometry& geo = *rows.geo;
#pragma omp parallel for schedule(static)
  for (int i = 0; i < rows.count; ++i)
    for (int h = 0; h < heads; ++h)
      rope.rotate(v + (static_cast<long>(i) * heads + h) * dim + dim - rope_dim,
                  geo.row_position[rows.row(i)], sign);
}

void hadamard_heads(float* v, long vectors, int dim, bool bf16) {
#pragma omp parallel for schedule(static)
  for (long i = 0; i < vectors; ++i) {
    hadamard(v + i * dim, dim);
    round_to_storage(v + i * dim, dim, bf16);
  }
}

// Grouped low-rank O projection: u[t, g*r_o + r] = sum_d W_oa[g*r_o + r, d] o[t, g, d].
void grouped_o_forward(const AttentionConfig& c, int T, const float* o, const float* woa,
                       float* u) {
  const int G = c.o_groups, ro = c.o_lora_rank, gd = c.n_heads * c.head_dim / G;
  const int hd = c.n_heads * c.head_dim;
  for (int g = 0; g < G; ++g)
    gemm(false, true, T, ro, gd, 1.0f, o + static_cast<long>(g) * gd, hd,
         woa + static_cast<long>(g) * ro * gd, gd, 0.0f, u + static_cast<long>(g) * ro, G * ro);
}

void grouped_o_backward(const AttentionConfig& c, int T, const float* o, const float* woa,
                        const float* du, float* dO, float* dwoa) {
  const int G = c.o_groups, ro = c.o_lora_rank, gd = c.n_heads * c.head_dim / G;
  const int hd = c.n_heads * c.head_dim;
  for (int g = 0; g < G; ++g) {
    gemm(false, false, T, gd, ro, 1.0f, du + static_cast<long>(g) * ro, G * ro,
         woa + static_cast<long>(g) * ro * gd, gd, 0.0f, dO + static_cast<long>(g) * gd, hd);
    gemm(true, false, ro, gd, T, 1.0f, du + static_cast<long>(g) * ro, G * ro,
         o + static_cast<long>(g) * gd, hd, 1.0f, dwoa + static_cast<long>(g) * ro * gd, gd);
  }
}

}  // namespace

ThreadScope::ThreadScope(int threads) : saved_(omp_get_max_threads()) {
  if (threads > 0) omp_set_num_threads(threads);
}
ThreadScope::~ThreadScope() { omp_set_num_threads(saved_); }

RopeTable make_rope(const AttentionConfig& cfg, bool bf16) {
  return RopeTable{rope_frequencies(cfg), cfg.rope_dim / 2, bf16};
}

float attention_scale(const AttentionConfig& c) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
}

CompressorSpec main_compressor_spec(const AttentionConfig& c, bool bf16) {
  return {c.head_dim, c.rope_dim, false, static_cast<float>(c.norm_eps), bf16};
}
CompressorSpec indexer_compressor_spec(const AttentionConfig& c, bool bf16) {
  return {c.index_head_dim, c.rope_dim, true, static_cast<float>(c.norm_eps), bf16};
}

CompressorWeights compressor_weights(const LayerWeights& w, const std::string& prefix) {
  return {w.f32(prefix + "wkv.weight"), w.f32(prefix + "wgate.weight"), w.f32(prefix + "ape"),
          w.f32(prefix + "norm.weight")};
}
CompressorGrads compressor_grads(LayerWeights& g, const std::string& prefix) {
  return {g.f32(prefix + "wkv.weight"), g.f32(prefix + "wgate.weight"), g.f32(prefix + "ape"),
          g.f32(prefix + "norm.weight")};
}

void query_forward(const AttentionConfig& c, const LayerWeights& w, const RopeTable& rope,
                   const QueryRows& rows, const float* x, bool bf16, QueryPath& a) {
  const int n = rows.count, H = c.n_heads, D = c.head_dim, dm = c.d_model, rq = c.q_lora_rank;
  const float eps = static_cast<float>(c.norm_eps);
  a.q_proj = zeros(static_cast<std::size_t>(n) * rq);
  linear(x, n, dm, w.f32("attn.wq_a.weight"), rq, a.q_proj.data());
  round_to_storage(a.q_proj.data(), static_cast<long>(a.q_proj.size()), bf16);
  a.cq = zeros(a.q_proj.size());
  a.rstd_q = zeros(static_cast<std::size_t>(n));
  rmsnorm_forward(a.q_proj.data(), w.f32("attn.q_norm.weight"), n, rq, eps, a.cq.data(),
                  a.rstd_q.data());
  round_to_storage(a.cq.data(), static_cast<long>(a.cq.size()), bf16);
  a.qb_proj = zeros(static_cast<std::size_t>(n) * H * D);
  linear(a.cq.data(), n, rq, w.f32("attn.wq_b.weight"), H * D, a.qb_proj.data());
  round_to_storage(a.qb_proj.data(), static_cast<long>(a.qb_proj.size()), bf16);
  a.q = zeros(a.qb_proj.size());
  a.rstd_qh = zeros(static_cast<std::size_t>(n) * H);
  rmsnorm_forward(a.qb_proj.data(), nullptr, n * H, D, eps, a.q.data(), a.rstd_qh.data());
  round_to_storage(a.q.data(), static_cast<long>(a.q.size()), bf16);
  rope_heads(rope, rows, a.q.data(), H, D, c.rope_dim, +1);
}

void query_backward(const AttentionConfig& c, const LayerWeights& w, const RopeTable& rope,
                    const QueryRows& rows, const QueryPath& a, const float* x,
                    std::vector<float>& dq, LayerWeights& g, float* dx) {
  const int n = rows.count, H = c.n_heads, D = c.head_dim, dm = c.d_model, rq = c.q_lora_rank;
  rope_heads(rope, rows, dq.data(), H, D, c.rope_dim, -1);
  std::vector<float> dqb = zeros(dq.size());
  rmsnorm_backward(a.qb_proj.data(), nullptr, a.rstd_qh.data(), dq.data(), n * H, D, dqb.data(),
                   nullptr);
  std::vector<float> dcq = zeros(static_cast<std::size_t>(n) * rq);
  linear_grad_input(dqb.data(), n, H * D, w.f32("attn.wq_b.weight"), rq, dcq.data(), false);
  linear_grad_weight(dqb.data(), n, H * D, a.cq.data(), rq, g.f32("attn.wq_b.weight"), true);
  std::vector<float> dqa = zeros(dcq.size());
  rmsnorm_backward(a.q_proj.data(), w.f32("attn.q_norm.weight"), a.rstd_q.data(), dcq.data(), n,
                   rq, dqa.data(), g.f32("attn.q_norm.weight"));
  linear_grad_input(dqa.data(), n, rq, w.f32("attn.wq_a.weight"), dm, dx, true);
  linear_grad_weight(dqa.data(), n, rq, x, dm, g.f32("attn.wq_a.weight"), true);
}

void kv_forward(const AttentionConfig& c, const LayerWeights& w, const RopeTable& rope,
                const QueryRows& rows, const float* x, bool bf16, KvPath& a) {
  const int n = rows.count, D = c.head_dim, dm = c.d_model;
  a.kv_proj = zeros(static_cast<std::size_t>(n) * D);
  linear(x, n, dm, w.f32("attn.wkv.weight"), D, a.kv_proj.data());
  round_to_storage(a.kv_proj.data(), static_cast<long>(a.kv_proj.size()), bf16);
  a.kv = zeros(a.kv_proj.size());
  a.rstd_kv = zeros(static_cast<std::size_t>(n));
  rmsnorm_forward(a.kv_proj.data(), w.f32("attn.kv_norm.weight"), n, D,
                  static_cast<float>(c.norm_eps), a.kv.data(), a.rstd_kv.data());
  round_to_storage(a.kv.data(), static_cast<long>(a.kv.size()), bf16);
  rope_heads(rope, rows, a.kv.data(), 1, D, c.rope_dim, +1);
}

void kv_backward(const AttentionConfig& c, const LayerWeights& w, const RopeTable& rope,
                 const QueryRows& rows, const KvPath& a, const float* x, std::vector<float>& dkv,
                 LayerWeights& g, float* dx) {
  const int n = rows.count, D = c.head_dim, dm = c.d_model;
  rope_heads(rope, rows, dkv.data(), 1, D, c.rope_dim, -1);
  std::vector<float> dkva = zeros(dkv.size());
  rmsnorm_backward(a.kv_proj.data(), w.f32("attn.kv_norm.weight"), a.rstd_kv.data(), dkv.data(),
                   n, D, dkva.data(), g.f32("attn.kv_norm.weight"));
  linear_grad_input(dkva.data(), n, D, w.f32("attn.wkv.weight"), dm, dx, true);
  linear_grad_weight(dkva.data(), n, D, x, dm, g.f32("attn.wkv.weight"), true);
}

void indexer_query_forward(const AttentionConfig& c, const LayerWeights& w,
                           const RopeTable& rope, const QueryRows& rows, const float* cq,
                           const float* x, bool bf16, IndexerPath& a) {
  const int n = rows.count, HI = c.index_n_heads, DI = c.index_head_dim, dm = c.d_model;
  a.qi_proj = zeros(static_cast<std::size_t>(n) * HI * DI);
  linear(cq, n, c.q_lora_rank, w.f32("attn.indexer.wq_b.weight"), HI * DI, a.qi_proj.data());
  round_to_storage(a.qi_proj.data(), static_cast<long>(a.qi_proj.size()), bf16);
  a.qi = a.qi_proj;
  rope_heads(rope, rows, a.qi.data(), HI, DI, c.rope_dim, +1);
  hadamard_heads(a.qi.data(), static_cast<long>(n) * HI, DI, bf16);
  a.w_eff = zeros(static_cast<std::size_t>(n) * HI);
  linear(x, n, dm, w.f32("attn.indexer.weights_proj.weight"), HI, a.w_eff.data());
  // w' = ((W x) H_I^-1/2) D_I^-1/2 with a bf16 rounding after each product, as the
  // reference folds the indexer scale into bf16 weights.
  const float head_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HI)));
  const float dim_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(DI)));
  round_to_storage(a.w_eff.data(), static_cast<long>(a.w_eff.size()), bf16);
  for (float& v : a.w_eff) {
    v = bf16 ? round_bf16(v * head_scale) : v * head_scale;
    v = bf16 ? round_bf16(v * dim_scale) : v * dim_scale;
  }
}

void indexer_select(const AttentionConfig& c, const QueryRows& rows, const float* keys,
                    IndexerPath& a) {
  // The compact indexer (bf16 or mxfp8 operands) selects; with a sparse loss its softmax over
  // the selection is also the loss's predictor.
  const int n = rows.count, K = c.index_topk;
  a.topk.assign(static_cast<std::size_t>(n) * K, -1);
  const IndexerArgs ia{c.index_n_heads, c.index_head_dim, K, a.qi.data(), a.w_eff.data(), keys};
  const bool want_softmax = c.sparse_loss && c.loss_coeff > 0.0;
  std::vector<float> logits(static_cast<std::size_t>(n) * K);
  if (want_softmax) a.topk_softmax.assign(static_cast<std::size_t>(n) * K, 0.0f);
  layer_indexer_topk(rows, ia, c.indexer_precision, a.topk.data(), logits.data(),
                     want_softmax ? a.topk_softmax.data() : nullptr);
}

void indexer_query_backward(const AttentionConfig& c, const RopeTable& rope,
                            const QueryRows& rows, const float* cq, const float* x,
                            std::vector<float>& dqi, std::vector<float>& dweff,
                            LayerWeights& g) {
  const int n = rows.count, HI = c.index_n_heads, DI = c.index_head_dim, dm = c.d_model;
  hadamard_heads(dqi.data(), static_cast<long>(n) * HI, DI, false);
  rope_heads(rope, rows, dqi.data(), HI, DI, c.rope_dim, -1);
  linear_grad_weight(dqi.data(), n, HI * DI, cq, c.q_lora_rank,
                     g.f32("attn.indexer.wq_b.weight"), true);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HI)) /
                                         std::sqrt(static_cast<double>(DI)));
  for (float& v : dweff) v *= scale;
  linear_grad_weight(dweff.data(), n, HI, x, dm, g.f32("attn.indexer.weights_proj.weight"),
                     true);
}

LossArgs loss_args(const AttentionConfig& c, const LayerWeights& w, const IndexerPath& a,
                   const float* keys, const float* q, const float* kv, const float* comp) {
  LossArgs l;
  l.indexer = {c.index_n_heads, c.index_head_dim, c.index_topk, a.qi.data(), a.w_eff.data(),
               keys};
  l.teacher = {c.n_heads, c.head_dim, c.window, attention_scale(c), q, kv, comp,
               w.f32("attn.attn_sink")};
  l.topk = a.topk.data();
  l.predict = a.topk_softmax.empty() ? nullptr : a.topk_softmax.data();
  l.sparse = c.sparse_loss;
  l.per_token = c.per_token_loss;
  l.coeff = c.loss_coeff;
  return l;
}

Tensor output_forward(const AttentionConfig& c, const LayerWeights& w, const RopeTable& rope,
                      const QueryRows& rows, const std::vector<float>& attn, bool bf16,
                      std::vector<float>& attn_rot, std::vector<float>& u) {
  const int n = rows.count, dm = c.d_model, gro = c.o_groups * c.o_lora_rank;
  attn_rot = attn;
  rope_heads(rope, rows, attn_rot.data(), c.n_heads, c.head_dim, c.rope_dim, -1);
  u = zeros(static_cast<std::size_t>(n) * gro);
  grouped_o_forward(c, n, attn_rot.data(), w.f32("attn.wo_a.weight"), u.data());
  round_to_storage(u.data(), static_cast<long>(u.size()), bf16);
  Tensor out(DType::f32, {n, dm});
  linear(u.data(), n, gro, w.f32("attn.wo_b.weight"), dm, out.ptr<float>());
  round_to_storage(out.ptr<float>(), out.numel(), bf16);
  return out;
}

std::vector<float> output_backward(const AttentionConfig& c, const LayerWeights& w,
                                   const RopeTable& rope, const QueryRows& rows,
                                   const std::vector<float>& attn_rot,
                                   const std::vector<float>& u, const float* dy,
                                   LayerWeights& g) {
  const int n = rows.count, H = c.n_heads, D = c.head_dim, dm = c.d_model;
  const int gro = c.o_groups * c.o_lora_rank;
  std::vector<float> du = zeros(static_cast<std::size_t>(n) * gro);
  linear_grad_input(dy, n, dm, w.f32("attn.wo_b.weight"), gro, du.data(), false);
  linear_grad_weight(dy, n, dm, u.data(), gro, g.f32("attn.wo_b.weight"), true);
  std::vector<float> dattn = zeros(static_cast<std::size_t>(n) * H * D);
  grouped_o_backward(c, n, attn_rot.data(), w.f32("attn.wo_a.weight"), du.data(), dattn.data(),
                     g.f32("attn.wo_a.weight"));
  rope_heads(rope, rows, dattn.data(), H, D, c.rope_dim, +1);  // (R^-1)^T = R
  return dattn;
}

}  // namespace csattn::cpu
