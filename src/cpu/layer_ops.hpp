// The stages of the CPU layer composition, shared by the single-rank HybridAttentionLayer
// (src/cpu/layer.cpp: every row of the batch) and one rank of the ContextParallelLayer
// (src/cp/cp_layer.cpp: its local rows, and its halo + local rows for K=V). Each stage runs
// on a row set (core/geometry.hpp QueryRows) and reads each row's position from the global
// geometry, so both layers call the same code with the same operations in the same order:
// that is what keeps the CP fp32 forward bitwise equal to the single-rank one
// (docs/numerics.md). Change a stage here and both layers change together.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/geometry.hpp"
#include "cpu/compressor.hpp"
#include "cpu/elementwise.hpp"
#include "cpu/indexer_loss.hpp"
#include "csattn/config.hpp"
#include "csattn/tensor.hpp"
#include "csattn/weights.hpp"

namespace csattn::cpu {

inline std::vector<float> zeros(std::size_t n) { return std::vector<float>(n, 0.0f); }

// Applies RunOptions::threads to OpenMP for the duration of a call (0: leaves it as is).
class ThreadScope {
 public:
  explicit ThreadScope(int threads);
  ~ThreadScope();
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int saved_;
};

// The layer's RoPE table (core/rope_table.hpp); bf16: bf16 cos/sin and rounded results.
RopeTable make_rope(const AttentionConfig& cfg, bool bf16);

// tau = D^-1/2, the attention's (and the indexer loss teacher's) softmax scale.
float attention_scale(const AttentionConfig& c);

CompressorSpec main_compressor_spec(const AttentionConfig& c, bool bf16);
CompressorSpec indexer_compressor_spec(const AttentionConfig& c, bool bf16);
// The compressor parameters under `prefix` ("attn.compressor.", "attn.indexer.compressor.").
CompressorWeights compressor_weights(const LayerWeights& w, const std::string& prefix);
CompressorGrads compressor_grads(LayerWeights& g, const std::string& prefix);

// In every stage below, n = rows.count and the row-major buffers hold the rows in the order
// of `rows`; x is the hidden rows [n, d_model] (storage-rounded), dx [n, d_model] accumulates;
// weight gradients accumulate into g. Gradients stay fp32 (rope from make_rope(c, false)).

// Query path: down-projection, RMSNorm, up-projection, weightless per-head RMS, RoPE.
struct QueryPath {
  std::vector<float> q_proj, cq, rstd_q;   // [n, r_q], [n, r_q], [n]
  std::vector<float> qb_proj, rstd_qh, q;  // [n, H*D], [n*H], [n, H, D] after RoPE
};
void query_forward(const AttentionConfig& c, const LayerWeights& w, const RopeTable& rope,
                   const QueryRows& rows, const float* x, bool bf16, QueryPath& a);
// dq [n, H, D]: the gradient of a.q (inverse-rotated in place).
void query_backward(const AttentionConfig& c, const LayerWeights& w, const RopeTable& rope,
                    const QueryRows& rows, const QueryPath& a, const float* x,
                    std::vector<float>& dq, LayerWeights& g, float* dx);

// The shared K=V head: projection, RMSNorm, RoPE.
struct KvPath {
  std::vector<float> kv_proj, rstd_kv, kv;  // [n, D], [n], [n, D] after RoPE
};
void kv_forward(const AttentionConfig& c, const LayerWeights& w, const RopeTable& rope,
                const QueryRows& rows, const float* x, bool bf16, KvPath& a);
// dkv [n, D]: the gradient of a.kv (inverse-rotated in place).
void kv_backward(const AttentionConfig& c, const LayerWeights& w, const RopeTable& rope,
                 const QueryRows& rows, const KvPath& a, const float* x, std::vector<float>& dkv,
                 LayerWeights& g, float* dx);

// The lightning indexer's queries, head weights and selection. Its inputs (cq and x) are
// detached: its backward gives weight gradients only.
struct IndexerPath {
  std::vector<float> qi_proj, qi;          // [n, H_I*D_I] before / after RoPE + Hadamard
  std::vector<float> w_eff;                // [n, H_I] effective head weights
  std::vector<std::int32_t> topk;          // [n, K]
  std::vector<float> topk_softmax;         // [n, K] compact softmax (sparse-loss predictor)
};
// qi and w_eff; cq: [n, r_q] from the query path.
void indexer_query_forward(const AttentionConfig& c, const LayerWeights& w,
                           const RopeTable& rope, const QueryRows& rows, const float* cq,
                           const float* x, bool bf16, IndexerPath& a);
// topk (and topk_softmax when a sparse loss uses it) by the compact indexer, over keys: the
// batch's sequence-major indexer compressor rows [Nc, D_I].
void indexer_select(const AttentionConfig& c, const QueryRows& rows, const float* keys,
                    IndexerPath& a);
// dqi [n, H_I*D_I], dweff [n, H_I]: gradients of a.qi and a.w_eff (both changed in place).
void indexer_query_backward(const AttentionConfig& c, const RopeTable& rope,
                            const QueryRows& rows, const float* cq, const float* x,
                            std::vector<float>& dqi, std::vector<float>& dweff,
                            LayerWeights& g);
// The indexer loss's arguments. keys [Nc, D_I], comp [Nc, D]: the sequence-major compressed
// rows; q [n, H, D] the queries, kv the raw K=V rows (QueryRows::kv_row indexes them).
LossArgs loss_args(const AttentionConfig& c, const LayerWeights& w, const IndexerPath& a,
                   const float* keys, const float* q, const float* kv, const float* comp);

// Output projections of the attention output attn [n, H, D]: inverse RoPE (attn_rot), grouped
// low-rank O (u [n, G*r_o]), wo_b. Returns the layer output [n, d_model].
Tensor output_forward(const AttentionConfig& c, const LayerWeights& w, const RopeTable& rope,
                      const QueryRows& rows, const std::vector<float>& attn, bool bf16,
                      std::vector<float>& attn_rot, std::vector<float>& u);
// dy [n, d_model]; returns the gradient of attn [n, H, D].
std::vector<float> output_backward(const AttentionConfig& c, const LayerWeights& w,
                                   const RopeTable& rope, const QueryRows& rows,
                                   const std::vector<float>& attn_rot,
                                   const std::vector<float>& u, const float* dy,
                                   LayerWeights& g);

}  // namespace csattn::cpu
