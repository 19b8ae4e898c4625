#include "cuda/forward.hpp"

#include <algorithm>

#include "cuda/check.hpp"
#include "cuda/gemm.hpp"
#include "cuda/kernels.hpp"

namespace csattn::cuda {

void forward_projections(const ForwardParams& p, cublasHandle_t blas, cudaStream_t stream) {
  const LayerDims& d = p.dims;
  const DeviceWeights& w = p.w;
  const DeviceMetadata& m = p.meta;
  const DeviceActivations& a = p.act;
  const int T = d.rows, H = d.heads, D = d.head_dim;
  // Query path.
  linear(blas, a.x, T, d.d_model, w.wq_a, d.q_lora_rank, a.q_proj);
  NormRopeArgs cq = token_rows_args(d, w, m, a.q_proj, a.cq, T, d.q_lora_rank, 1);
  cq.norm = true;
  cq.weight = w.q_norm;
  launch_norm_rope(cq, stream);
  // The per-head projection, then its norm and RoPE in place (the kernels read a row before
  // writing it); the backward needs only the result and each row's 1 / rms.
  linear(blas, a.cq, T, d.q_lora_rank, w.wq_b, H * D, a.q);
  NormRopeArgs qn = token_rows_args(d, w, m, a.q, a.q, T * H, D, H);
  qn.norm = true;
  qn.rope_dim = d.rope_dim;
  qn.rstd = a.q_rstd;
  launch_norm_rope(qn, stream);
  // The shared K=V head.
  linear(blas, a.x, T, d.d_model, w.wkv, D, a.kv_proj);
  NormRopeArgs kvn = token_rows_args(d, w, m, a.kv_proj, a.kv, T, D, 1);
  kvn.norm = true;
  kvn.weight = w.kv_norm;
  kvn.rope_dim = d.rope_dim;
  launch_norm_rope(kvn, stream);
}

void forward_compressor(const ForwardParams& p, Compressor which, const LayerDims& cd,
                        const DeviceMetadata& cm, bf16* pooled, bf16* out, cublasHandle_t blas,
                        cudaStream_t stream) {
  const LayerDims& d = p.dims;
  const DeviceWeights& w = p.w;
  const DeviceActivations& a = p.act;
  const bool main = which == Compressor::main;
  const int n = main ? d.head_dim : d.index_dim;
  const int width = main ? d.coff * n : 2 * n;
  bf16* pa = main ? a.c_a : a.i_a;
  bf16* pg = main ? a.c_g : a.i_g;
  linear(blas, a.x, d.rows, d.d_model, main ? w.c_wkv : w.ic_wkv, width, pa);
  linear(blas, a.x, d.rows, d.d_model, main ? w.c_wgate : w.ic_wgate, width, pg);
  launch_compressor_pool(cd, cm, n, pa, pg, main ? w.c_ape : w.ic_ape, pooled, stream);
  NormRopeArgs r = compressed_rows_args(cd, w, cm, pooled, out, n);
  r.norm = true;
  r.weight = main ? w.c_norm : w.ic_norm;
  r.rope_dim = d.rope_dim;
  r.hadamard = !main;
  launch_norm_rope(r, stream);
}

void forward_indexer_queries(const ForwardParams& p, cublasHandle_t blas, cudaStream_t stream) {
  const LayerDims& d = p.dims;
  const DeviceWeights& w = p.w;
  const DeviceActivations& a = p.act;
  const int T = d.rows, HI = d.index_heads, DI = d.index_dim;
  linear(blas, a.cq, T, d.q_lora_rank, w.i_wq_b, HI * DI, a.qi_proj);
  NormRopeArgs qi = token_rows_args(d, w, p.meta, a.qi_proj, a.qi, T * HI, DI, HI);
  qi.rope_dim = d.rope_dim;
  qi.hadamard = true;
  launch_norm_rope(qi, stream);
  linear(blas, a.x, T, d.d_model, w.i_wproj, HI, a.w_raw);
  launch_indexer_weights(d, a.w_raw, a.w_eff, stream);
}

void forward_selection(const ForwardParams& p, cudaStream_t stream) {
  const LayerDims& d = p.dims;
  const DeviceActivations& a = p.act;
  const bf16 *sel_q = a.qi, *sel_keys = a.i_keys;
  if (d.mxfp8_indexer) {  // the selection's operands through MXFP8 (qi_proj is dead here)
    launch_mxfp8_roundtrip(a.qi, a.qi_proj, static_cast<long>(d.rows) * d.index_heads,
                           d.index_dim, stream);
    launch_mxfp8_roundtrip(a.i_keys, a.i_keys_mx, d.comp_capacity, d.index_dim, stream);
    sel_q = a.qi_proj;
    sel_keys = a.i_keys_mx;
  }
  // The loss launch reads them where loss_logits_from_selection says so (the same test the
  // loss launch makes): the automatic kernel is one that writes them.
  SelectedScores scores;
  if (loss_logits_from_selection(p)) scores = {a.loss_kept + 1, 2};  // (mass, logit) pairs
  launch_indexer_topk(d, p.meta, sel_q, a.w_eff, sel_keys, a.topk, a.topk_scratch, stream,
                      IndexerKernel::automatic, scores);
}

bool loss_logits_from_selection(const ForwardParams& p) {
  if (p.act.loss_kept == nullptr || p.forced_topk || p.dims.ratio != 4) return false;
  const IndexerKernel k = indexer_kernel_for(p.dims);
  return indexer_writes_selected_scores(k);
}

void forward_attention(const ForwardParams& p, cudaStream_t stream) {
  const DeviceActivations& a = p.act;
  launch_sparse_attention(p.dims, p.meta, a.q, a.kv, a.comp, p.w.sink, a.topk, a.attn, a.lse,
                          stream);
}

NormRopeArgs rope_rows_args(const ForwardParams& f, bf16* v, int rows, int n, int per_token, int sign) {
  NormRopeArgs a = token_rows_args(f.dims, f.w, f.meta, v, v, rows, n, per_token);
  a.rope_dim = f.dims.rope_dim;
  a.rope_sign = sign;
  return a;
}

OutputRows attention_output(const ForwardParams& p) {
  return {p.act.attn, p.act.attn_tail, attention_tail_dim(p.dims)};
}

void forward_output(const ForwardParams& p, cublasHandle_t blas, cudaStream_t stream) {
  const LayerDims& d = p.dims;
  const DeviceActivations& a = p.act;
  const int T = d.rows, H = d.heads, D = d.head_dim, G = d.o_groups, gro = G * d.o_lora_rank;
  // The inverse RoPE in place, where only each head row's rotated tail is read and written
  // (the tail kernel of launch_norm_rope), its values before the rotation kept in attn_tail:
  // attn becomes the grouped projection's input, which the wo_a gradient reads again, and
  // attn's heads with attn_tail are still O for the attention backward. (It was an
  // out-of-place pass over whole rows, in chunks, recomputed in the backward: three passes
  // over [T, H*D] a training step where this makes one over its tails.)
  NormRopeArgs inv = rope_rows_args(p, a.attn, T * H, D, H, -1);
  inv.keep_tail = a.attn_tail;
  inv.keep_tail_dim = attention_tail_dim(d);
  launch_norm_rope(inv, stream);
  grouped_linear(blas, a.attn, T, G, H * D / G, p.w.wo_a, d.o_lora_rank, a.u);
  linear(blas, a.u, T, gro, p.w.wo_b, d.d_model, a.y);
}

void run_forward(const ForwardParams& p, cublasHandle_t blas, cudaStream_t stream,
                 StageTimer* timer) {
  const LayerDims& d = p.dims;
  const DeviceMetadata& m = p.meta;
  const DeviceActivations& a = p.act;
  use_blas(blas, stream, p.blas_workspace, p.blas_workspace_bytes);
  Stages st{timer, stream};
  st.mark(nullptr);

  launch_metadata(d, m, stream);
  launch_rope_table(d, p.w.omega, m.rope_table, stream);
  forward_projections(p, blas, stream);
  st.mark("q/kv projections");
  if (d.ratio > 1) {
    forward_compressor(p, Compressor::main, d, m, a.c_pooled, a.comp, blas, stream);
    st.mark("compressor");
  }
  if (d.ratio == 4) {
    forward_indexer_queries(p, blas, stream);
    forward_compressor(p, Compressor::indexer, d, m, a.i_pooled, a.i_keys, blas, stream);
    st.mark("indexer q/k");
    if (!p.forced_topk) forward_selection(p, stream);
    st.mark("indexer top-k");
  }
  forward_attention(p, stream);
  st.mark("sparse attention");
  forward_output(p, blas, stream);
  st.mark("output projections");
}

}  // namespace csattn::cuda
