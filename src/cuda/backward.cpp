#include "cuda/backward.hpp"

#include <algorithm>

#include "cuda/backward_kernels.hpp"
#include "cuda/check.hpp"
#include "cuda/gemm.hpp"
#include "cuda/kernels.hpp"
#include "cuda/ordered_scatter.hpp"

namespace csattn::cuda {

namespace {

// RoPE^T (sign -1) or the transpose of the inverse RoPE (sign +1) on token rows, in place.
void rope_rows(const ForwardParams& f, bf16* v, int rows, int n, int per_token, int sign,
               cudaStream_t stream) {
  launch_norm_rope(rope_rows_args(f, v, rows, n, per_token, sign), stream);
}

// Rows per deterministic chunk: as many as the scratch holds (plan_backward sized it).
int deterministic_chunk_rows(const BackwardBuffers& b, int rows, int slots, int width) {
  require(b.det_scratch != nullptr, ErrorKind::InvalidArgument,
          "deterministic backward without its scratch (plan_backward(..., true))");
  return scatter_chunk_rows(rows, slots, width, b.det_scratch_bytes);
}

// What the sparse loss's forward launch keeps for its backward launch (launch_indexer_loss's
// `kept`; planned for the sparse loss only).
float* loss_kept(const ForwardParams& f, const BackwardParams& b) {
  return b.sparse_loss ? f.act.loss_kept : nullptr;
}

IndexerLossArgs loss_args(const ForwardParams& f, const BackwardParams& b) {
  IndexerLossArgs l;
  l.qi = f.act.qi;
  l.w_eff = f.act.w_eff;
  l.keys = f.act.i_keys;
  l.q = f.act.q;
  l.kv = f.act.kv;
  l.comp = f.act.comp;
  l.sink = f.w.sink;
  l.topk = f.act.topk;
  l.lse = f.act.lse;
  l.sparse = b.sparse_loss;
  l.scale = f.meta.loss_scale;
  if (mxfp8_predictor(f, b)) {  // the sparse loss's predictor: the MXFP8 selection's scores
    l.pred_qi = f.act.qi_proj;   // qi through MXFP8 (forward.cpp)
    l.pred_keys = f.act.i_keys_mx;
  }
  return l;
}

}  // namespace

void check_backward_supported(const AttentionConfig& c, const ForwardParams& f, bool deterministic,
                              float grad_indexer_loss) {
  require(!(deterministic && c.has_indexer() && c.loss_coeff > 0.0 && grad_indexer_loss != 0.0f) ||
              indexer_loss_mma_supported(f.dims),
          ErrorKind::Unsupported,
          "deterministic backward: the indexer loss gradient needs the tensor-core loss kernel "
          "(head_dim 512, index_head_dim 128, at most 64 index heads and 128 heads); use the "
          "fast (atomic) backward for this shape");
}

void run_indexer_loss(const ForwardParams& f, const BackwardParams& b, cudaStream_t stream) {
  const IndexerLossArgs l = loss_args(f, b);
  float* kept = loss_kept(f, b);
  launch_indexer_loss(f.dims, f.meta, l, f.act.loss_rows, f.act.loss, false, 0.0f, nullptr, nullptr,
                      nullptr, kept, stream, IndexerLossKernel::automatic,
                      kept != nullptr && loss_logits_from_selection(f));
}

bool mxfp8_predictor(const ForwardParams& f, const BackwardParams& b) {
  return f.dims.mxfp8_indexer && b.sparse_loss && !f.forced_topk;
}

void backward_output(const ForwardParams& f, const BackwardParams& p, cublasHandle_t blas,
                     cudaStream_t stream) {
  const LayerDims& d = f.dims;
  const BackwardBuffers& b = p.buf;
  const int T = d.rows, HD = d.heads * d.head_dim, dm = d.d_model;
  const int gro = d.o_groups * d.o_lora_rank, gd = HD / d.o_groups;
  // Output projections (the wo_a gradient reads the rotated output the forward left in attn),
  // then the transpose of the inverse RoPE (a forward rotation, in place on the tails).
  linear_grad_input(blas, b.dy, T, dm, f.w.wo_b, gro, b.du);
  linear_grad_weight(blas, b.dy, T, dm, f.act.u, gro, p.grad.wo_b);
  grouped_linear_grad_weight(blas, b.du, T, d.o_groups, gd, f.act.attn, d.o_lora_rank, p.grad.wo_a);
  grouped_linear_grad_input(blas, b.du, T, d.o_groups, gd, f.w.wo_a, d.o_lora_rank, b.dattn);
  rope_rows(f, b.dattn, T * d.heads, d.head_dim, d.heads, +1, stream);
}

void backward_attention(const ForwardParams& f, const BackwardParams& p, cudaStream_t stream,
                        Stages* st) {
  const LayerDims& d = f.dims;
  const DeviceWeights& w = f.w;
  const DeviceActivations& a = f.act;
  const BackwardBuffers& b = p.buf;
  const int T = d.rows, D = d.head_dim, Nc = d.comp_capacity;
  CSATTN_CUDA_CHECK(cudaMemsetAsync(b.dkv_acc, 0, sizeof(float) * static_cast<std::size_t>(T) * D, stream));
  if (Nc > 0)
    CSATTN_CUDA_CHECK(cudaMemsetAsync(b.dcomp_acc, 0, sizeof(float) * static_cast<std::size_t>(Nc) * D, stream));
  if (p.deterministic) {
    // Row chunks write their key-gradient contributions to the scratch; the ordered scatter
    // adds them per key row in row order (grad_chunk.hpp, ordered_scatter.hpp). HCA's
    // compressed rows instead: key-stationary, after the chunks (one scratch row per (query,
    // compressed key) would grow as T x L / 128).
    const bool keyed = comp_grad_keyed_applies(d);
    const int copies = attention_backward_copies(d);
    const int slots = keyed ? d.window : max_keys_per_query(d);
    OrderedScatter os;
    os.layout = SlotLayout::attention;
    os.slots = slots;
    os.width = D;
    os.dst_window = b.dkv_acc;
    os.dst_comp = keyed ? nullptr : b.dcomp_acc;
    os.copies = copies;
    const int chunk_rows = deterministic_chunk_rows(b, T, slots * copies, D);
    for (int r0 = 0; r0 < T; r0 += chunk_rows) {
      GradChunk c{r0, std::min(chunk_rows, T - r0), b.det_scratch, slots, copies};
      c.window_only = keyed;
      launch_attention_backward(d, f.meta, a.q, a.kv, a.comp, w.sink, a.topk, attention_output(f), a.lse,
                                b.dattn, b.dq, b.dkv_acc, b.dcomp_acc, b.dsink_part, stream, c);
      launch_ordered_scatter(d, f.meta, a.topk, os, c.r0, c.rows, b.det_scratch, stream);
    }
    launch_column_sum(b.dsink_part, T, d.heads, p.grad.sink, stream);
    if (st) st->mark("attention");
    // dsink_part is dead after its column sum: it holds the keyed pass's D_row.
    if (keyed) {
      launch_comp_grad_keyed(d, f.meta, a.q, a.comp, attention_output(f), a.lse, b.dattn, b.dsink_part,
                             b.dcomp_acc, b.det_scratch, b.det_scratch_bytes, stream);
      if (st) st->mark("attention keyed rows");
    }
    return;
  }
  launch_attention_backward(d, f.meta, a.q, a.kv, a.comp, w.sink, a.topk, attention_output(f), a.lse, b.dattn,
                            b.dq, b.dkv_acc, b.dcomp_acc, b.dsink_part, stream);
  launch_column_sum(b.dsink_part, T, d.heads, p.grad.sink, stream);
  if (st) st->mark("attention");
}

void backward_query_path(const ForwardParams& f, const BackwardParams& p, cublasHandle_t blas,
                         cudaStream_t stream) {
  const LayerDims& d = f.dims;
  const DeviceWeights& w = f.w;
  const DeviceActivations& a = f.act;
  const BackwardBuffers& b = p.buf;
  const DeviceGradients& g = p.grad;
  const int T = d.rows, H = d.heads, D = d.head_dim, HD = H * D, dm = d.d_model;
  // dq (bf16 from the attention backward) through the per-head norm in RoPE's frame, from the
  // norm's output q and its stored 1 / rms; then RoPE undone (in the same pass).
  const NormRopeArgs undo = rope_rows_args(f, b.dqb, T * H, D, H, -1);
  launch_rmsnorm_backward_from_output(a.q, a.q_rstd, b.dq, T * H, D, b.dqb, stream, false, &undo);
  linear_grad_input(blas, b.dqb, T, HD, w.wq_b, d.q_lora_rank, b.dcq);
  linear_grad_weight(blas, b.dqb, T, HD, a.cq, d.q_lora_rank, g.wq_b);
  launch_rmsnorm_backward(a.q_proj, w.q_norm, b.dcq, T, d.q_lora_rank, d.eps, b.dnormed, g.q_norm,
                          b.rstd, nullptr, 0, stream);
  linear_grad_input_f32(blas, b.dnormed, T, d.q_lora_rank, w.wq_a, dm, b.dx, false);
  linear_grad_weight(blas, b.dnormed, T, d.q_lora_rank, a.x, dm, g.wq_a);
}

void backward_kv_path(const ForwardParams& f, const BackwardParams& p, cublasHandle_t blas,
                      cudaStream_t stream) {
  const LayerDims& d = f.dims;
  const BackwardBuffers& b = p.buf;
  const int T = d.rows, D = d.head_dim, dm = d.d_model;
  launch_f32_to_bf16(b.dkv_acc, b.dkv, static_cast<long>(T) * D, stream);
  rope_rows(f, b.dkv, T, D, 1, -1, stream);
  launch_rmsnorm_backward(f.act.kv_proj, f.w.kv_norm, b.dkv, T, D, d.eps, b.dnormed,
                          p.grad.kv_norm, b.rstd, nullptr, 0, stream);
  linear_grad_input_f32(blas, b.dnormed, T, D, f.w.wkv, dm, b.dx, true);
  linear_grad_weight(blas, b.dnormed, T, D, f.act.x, dm, p.grad.wkv);
}

void backward_compressor(const ForwardParams& f, const BackwardParams& p, Compressor which,
                         const LayerDims& cd, const DeviceMetadata& cm, const float* dout_acc,
                         cublasHandle_t blas, cudaStream_t stream) {
  const LayerDims& d = f.dims;
  const DeviceWeights& w = f.w;
  const DeviceActivations& a = f.act;
  const BackwardBuffers& b = p.buf;
  const DeviceGradients& g = p.grad;
  const bool main = which == Compressor::main;
  const int n = main ? d.head_dim : d.index_dim, width = main ? d.coff * n : 2 * n;
  const int T = d.rows, dm = d.d_model, Nc = cd.comp_capacity;
  launch_f32_to_bf16(dout_acc, b.dcomp, static_cast<long>(Nc) * n, stream);
  // Hadamard (indexer) then RoPE^T at the entries' positions, in place.
  NormRopeArgs r = compressed_rows_args(cd, w, cm, b.dcomp, b.dcomp, n);
  if (!main) {  // the forward applied RoPE then Hadamard: undo in reverse order
    r.hadamard = true;
    launch_norm_rope(r, stream);
    r.hadamard = false;
  }
  r.rope_dim = d.rope_dim;
  r.rope_sign = -1;
  launch_norm_rope(r, stream);
  launch_rmsnorm_backward(main ? a.c_pooled : a.i_pooled, main ? w.c_norm : w.ic_norm, b.dcomp,
                          Nc, n, d.eps, b.dpooled, main ? g.c_norm : g.ic_norm, b.rstd,
                          cm.comp_entry_pos != nullptr ? nullptr : cm.comp_start, cd.segments,
                          stream);
  launch_compressor_pool_backward(cd, cm, n, main ? a.c_a : a.i_a, main ? a.c_g : a.i_g,
                                  main ? w.c_ape : w.ic_ape, b.dpooled, b.da, b.dg,
                                  main ? g.c_ape : g.ic_ape, stream);
  linear_grad_weight(blas, b.da, T, width, a.x, dm, main ? g.c_wkv : g.ic_wkv);
  linear_grad_weight(blas, b.dg, T, width, a.x, dm, main ? g.c_wgate : g.ic_wgate);
  if (main) {  // the indexer compressor sees x detached: no dx
    linear_grad_input_f32(blas, b.da, T, width, w.c_wkv, dm, b.dx, true);
    linear_grad_input_f32(blas, b.dg, T, width, w.c_wgate, dm, b.dx, true);
  }
}

void backward_indexer_loss(const ForwardParams& f, const BackwardParams& p, cudaStream_t stream) {
  const LayerDims& d = f.dims;
  const DeviceActivations& a = f.act;
  const BackwardBuffers& b = p.buf;
  CSATTN_CUDA_CHECK(cudaMemsetAsync(b.dkeys_acc, 0, sizeof(float) * static_cast<std::size_t>(d.comp_capacity) * d.index_dim, stream));
  // With the upstream gradient on the device: its product with the loss scale there, and a
  // launch gradient of 1.
  IndexerLossArgs la = loss_args(f, p);
  float grad_loss = p.grad_loss;
  if (p.grad_loss_on_device != nullptr) {
    launch_loss_gradient_scale(p.grad_loss_on_device, f.meta.loss_scale, b.loss_grad_scale, stream);
    la.scale = b.loss_grad_scale;
    grad_loss = 1.0f;
  }
  if (p.deterministic) {
    OrderedScatter os;
    os.layout = la.sparse ? SlotLayout::loss_sparse : SlotLayout::loss_dense;
    os.slots = la.sparse ? d.topk : std::max(1, d.max_seg_len / d.ratio);
    os.width = d.index_dim;
    os.dst_comp = b.dkeys_acc;
    const int T = d.rows;
    const int chunk_rows = deterministic_chunk_rows(b, T, os.slots, d.index_dim);
    for (int r0 = 0; r0 < T; r0 += chunk_rows) {
      la.chunk = GradChunk{r0, std::min(chunk_rows, T - r0), b.det_scratch, os.slots, 1};
      launch_indexer_loss(d, f.meta, la, a.loss_rows, a.loss, true, grad_loss, b.dqi, b.dweff,
                          b.dkeys_acc, loss_kept(f, p), stream, IndexerLossKernel::automatic, false,
                          !f.forced_topk);
      launch_ordered_scatter(d, f.meta, a.topk, os, r0, la.chunk.rows, b.det_scratch, stream);
    }
  } else {
    launch_indexer_loss(d, f.meta, la, a.loss_rows, a.loss, true, grad_loss, b.dqi, b.dweff,
                        b.dkeys_acc, loss_kept(f, p), stream, IndexerLossKernel::automatic, false,
                        !f.forced_topk);
  }
}

void backward_indexer_queries(const ForwardParams& f, const BackwardParams& p,
                              cublasHandle_t blas, cudaStream_t stream) {
  const LayerDims& d = f.dims;
  const BackwardBuffers& b = p.buf;
  const int T = d.rows, HI = d.index_heads, DI = d.index_dim;
  // qI: Hadamard then RoPE^T per head, then the weight gradient of wq_b.
  NormRopeArgs had = token_rows_args(d, f.w, f.meta, b.dqi, b.dqi, T * HI, DI, HI);
  had.hadamard = true;
  launch_norm_rope(had, stream);
  rope_rows(f, b.dqi, T * HI, DI, HI, -1, stream);
  linear_grad_weight(blas, b.dqi, T, HI * DI, f.act.cq, d.q_lora_rank, p.grad.i_wq_b);
  launch_indexer_weights_backward(d, b.dweff, b.dwraw, stream);
  linear_grad_weight(blas, b.dwraw, T, HI, f.act.x, d.d_model, p.grad.i_wproj);
}

bool indexer_loss_backward_runs(const ForwardParams& f, const BackwardParams& p) {
  // Host-known: lambda and the host upstream gradient (one on the device counts as nonzero).
  // A batch without real rows, or a device gradient of 0, runs it and computes zeros.
  return f.dims.ratio == 4 && f.dims.loss_coeff != 0.0 &&
         (p.grad_loss_on_device != nullptr || p.grad_loss != 0.0f);
}

void run_backward(const ForwardParams& f, const BackwardParams& p, cublasHandle_t blas,
                  cudaStream_t stream, StageTimer* timer) {
  const LayerDims& d = f.dims;
  use_blas(blas, stream, f.blas_workspace, f.blas_workspace_bytes);
  Stages st{timer, stream};
  st.mark(nullptr);
  backward_output(f, p, blas, stream);
  st.mark("output projections");
  backward_attention(f, p, stream, &st);
  backward_query_path(f, p, blas, stream);
  st.mark("q path");
  backward_kv_path(f, p, blas, stream);
  st.mark("kv path");
  if (d.ratio > 1) {  // the main compressor (not detached): back to x
    backward_compressor(f, p, Compressor::main, d, f.meta, p.buf.dcomp_acc, blas, stream);
    st.mark("compressor");
  }
  // The indexer: trained only by its loss, inputs detached (no dx).
  if (indexer_loss_backward_runs(f, p)) {
    backward_indexer_loss(f, p, stream);
    st.mark("indexer loss");
    backward_indexer_queries(f, p, blas, stream);
    st.mark("indexer q path");
    backward_compressor(f, p, Compressor::indexer, d, f.meta, p.buf.dkeys_acc, blas, stream);
    st.mark("indexer compressor");
  }
}

}  // namespace csattn::cuda
