#include "cuda/forward.hpp"

#include "cuda/check.hpp"
#include "cuda/gemm.hpp"
#include "cuda/kernels.hpp"

namespace csattn::cuda {

namespace {

NormRopeArgs compressed_rows(const LayerDims& d, const DeviceWeights& w,
                             const DeviceMetadata& m, const bf16* in, bf16* out, int n,
                             const bf16* norm, bool hadamard) {
  NormRopeArgs a = compressed_rows_args(d, w, m, in, out, n);
  a.norm = true;
  a.weight = norm;
  a.rope_dim = d.rope_dim;
  a.hadamard = hadamard;
  return a;
}

}  // namespace

void run_forward(const ForwardParams& p, cublasHandle_t blas, cudaStream_t stream,
                 StageTimer* timer) {
  const LayerDims& d = p.dims;
  const DeviceWeights& w = p.w;
  const DeviceMetadata& m = p.meta;
  const DeviceActivations& a = p.act;
  const int T = d.rows, H = d.heads, D = d.head_dim;
  CSATTN_CUBLAS_CHECK(cublasSetStream(blas, stream));
  if (p.blas_workspace)  // after SetStream, which resets cuBLAS to its own pool
    CSATTN_CUBLAS_CHECK(cublasSetWorkspace(blas, p.blas_workspace, p.blas_workspace_bytes));
  Stages st{timer, stream};
  st.mark(nullptr);

  launch_metadata(d, m, stream);
  launch_rope_table(d, w.omega, m.rope_table, stream);

  // Query path.
  linear(blas, a.x, T, d.d_model, w.wq_a, d.q_lora_rank, a.q_proj);
  NormRopeArgs cq = token_rows_args(d, w, m, a.q_proj, a.cq, T, d.q_lora_rank, 1);
  cq.norm = true;
  cq.weight = w.q_norm;
  launch_norm_rope(cq, stream);
  linear(blas, a.cq, T, d.q_lora_rank, w.wq_b, H * D, a.qb_proj);
  NormRopeArgs qn = token_rows_args(d, w, m, a.qb_proj, a.q, T * H, D, H);
  qn.norm = true;
  qn.rope_dim = d.rope_dim;
  launch_norm_rope(qn, stream);
  // The shared K=V head.
  linear(blas, a.x, T, d.d_model, w.wkv, D, a.kv_proj);
  NormRopeArgs kvn = token_rows_args(d, w, m, a.kv_proj, a.kv, T, D, 1);
  kvn.norm = true;
  kvn.weight = w.kv_norm;
  kvn.rope_dim = d.rope_dim;
  launch_norm_rope(kvn, stream);
  st.mark("q/kv projections");

  if (d.ratio > 1) {
    const int width = d.coff * D;
    linear(blas, a.x, T, d.d_model, w.c_wkv, width, a.c_a);
    linear(blas, a.x, T, d.d_model, w.c_wgate, width, a.c_g);
    launch_compressor_pool(d, m, D, a.c_a, a.c_g, w.c_ape, a.c_pooled, stream);
    launch_norm_rope(compressed_rows(d, w, m, a.c_pooled, a.comp, D, w.c_norm, false), stream);
    st.mark("compressor");
  }

  if (d.ratio == 4) {
    const int HI = d.index_heads, DI = d.index_dim;
    linear(blas, a.cq, T, d.q_lora_rank, w.i_wq_b, HI * DI, a.qi_proj);
    NormRopeArgs qi = token_rows_args(d, w, m, a.qi_proj, a.qi, T * HI, DI, HI);
    qi.rope_dim = d.rope_dim;
    qi.hadamard = true;
    launch_norm_rope(qi, stream);
    linear(blas, a.x, T, d.d_model, w.i_wproj, HI, a.w_raw);
    launch_indexer_weights(d, a.w_raw, a.w_eff, stream);
    linear(blas, a.x, T, d.d_model, w.ic_wkv, 2 * DI, a.i_a);
    linear(blas, a.x, T, d.d_model, w.ic_wgate, 2 * DI, a.i_g);
    launch_compressor_pool(d, m, DI, a.i_a, a.i_g, w.ic_ape, a.i_pooled, stream);
    launch_norm_rope(compressed_rows(d, w, m, a.i_pooled, a.i_keys, DI, w.ic_norm, true), stream);
    st.mark("indexer q/k");
    if (!p.forced_topk) {
      const bf16 *sel_q = a.qi, *sel_keys = a.i_keys;
      if (d.mxfp8_indexer) {  // the selection's operands through MXFP8 (qi_proj is dead here)
        launch_mxfp8_roundtrip(a.qi, a.qi_proj, static_cast<long>(T) * HI, DI, stream);
        launch_mxfp8_roundtrip(a.i_keys, a.i_keys_mx, d.comp_capacity, DI, stream);
        sel_q = a.qi_proj;
        sel_keys = a.i_keys_mx;
      }
      launch_indexer_topk(d, m, sel_q, a.w_eff, sel_keys, a.topk, a.topk_scratch, stream);
    }
    st.mark("indexer top-k");
  }

  launch_sparse_attention(d, m, a.q, a.kv, a.comp, w.sink, a.topk, a.attn, a.lse, stream);
  st.mark("sparse attention");

  NormRopeArgs inv = token_rows_args(d, w, m, a.attn, a.attn_rot, T * H, D, H);
  inv.rope_dim = d.rope_dim;
  inv.rope_sign = -1;
  launch_norm_rope(inv, stream);
  grouped_linear(blas, a.attn_rot, T, d.o_groups, H * D / d.o_groups, w.wo_a, d.o_lora_rank, a.u);
  linear(blas, a.u, T, d.o_groups * d.o_lora_rank, w.wo_b, d.d_model, a.y);
  st.mark("output projections");
}

}  // namespace csattn::cuda
