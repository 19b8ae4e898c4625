#include "cuda/workspace.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "csattn/weights.hpp"
#include "cuda/backward_kernels.hpp"
#include "cuda/check.hpp"
#include "cuda/indexer_topk_plan.hpp"

namespace csattn::cuda {

LayerDims make_dims(const AttentionConfig& c, int rows, int segments, int max_seg_len,
                    int comp_capacity) {
  LayerDims d;
  d.rows = rows;
  d.segments = segments;
  d.max_seg_len = max_seg_len;
  d.d_model = c.d_model;
  d.heads = c.n_heads;
  d.head_dim = c.head_dim;
  d.rope_dim = c.rope_dim;
  d.q_lora_rank = c.q_lora_rank;
  d.o_groups = c.o_groups;
  d.o_lora_rank = c.o_lora_rank;
  d.window = c.window;
  d.ratio = c.compress_ratio;
  d.coff = c.coff();
  d.comp_capacity = c.compress_ratio <= 1 ? 0 : comp_capacity >= 0 ? comp_capacity : rows / c.compress_ratio;
  d.index_heads = c.has_indexer() ? c.index_n_heads : 0;
  d.index_dim = c.has_indexer() ? c.index_head_dim : 0;
  d.topk = c.has_indexer() ? c.index_topk : 0;
  d.eps = static_cast<float>(c.norm_eps);
  d.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  d.mxfp8_indexer = c.has_indexer() && c.indexer_precision == IndexerPrecision::mxfp8;
  d.loss_coeff = c.has_indexer() ? c.loss_coeff : 0.0;
  d.per_token_loss = c.per_token_loss;
  return d;
}

WorkspacePlan plan_forward(const AttentionConfig& cfg, int rows, int segments, int max_seg_len,
                           int comp_capacity) {
  WorkspacePlan p;
  p.dims = make_dims(cfg, rows, segments, max_seg_len, comp_capacity);
  const LayerDims& d = p.dims;
  const std::size_t T = static_cast<std::size_t>(rows), Nc = static_cast<std::size_t>(d.comp_capacity);
  const std::size_t bf = sizeof(bf16), f32 = sizeof(float), i32 = sizeof(std::int32_t);
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t off = at;
    at += (bytes + 255) / 256 * 256;
    return off;
  };
  const std::size_t B1 = static_cast<std::size_t>(segments) + 1;
  p.cu_real = take(B1 * i32);
  p.cu_padded = take(B1 * i32);
  p.row_segment = take(T * i32);
  p.row_position = take(T * i32);
  p.row_is_padding = take(T);
  p.comp_start = take(B1 * i32);
  p.loss_scale = take(f32);
  p.rope_table = take(static_cast<std::size_t>(std::max(max_seg_len, 1)) *
                      static_cast<std::size_t>(cfg.rope_dim / 2) * 2 * bf);
  const std::size_t HD = static_cast<std::size_t>(d.heads) * d.head_dim;
  p.x = take(T * d.d_model * bf);
  p.q_proj = take(T * d.q_lora_rank * bf);
  p.cq = take(T * d.q_lora_rank * bf);
  p.q = take(T * HD * bf);
  p.q_rstd = take(T * d.heads * f32);
  p.kv_proj = take(T * d.head_dim * bf);
  p.kv = take(T * d.head_dim * bf);
  if (d.ratio > 1) {
    p.c_a = take(T * d.coff * d.head_dim * bf);
    p.c_g = take(T * d.coff * d.head_dim * bf);
    p.c_pooled = take(Nc * d.head_dim * bf);
    p.comp = take(Nc * d.head_dim * bf);
  }
  if (d.ratio == 4) {
    const std::size_t HID = static_cast<std::size_t>(d.index_heads) * d.index_dim;
    p.qi_proj = take(T * HID * bf);
    p.qi = take(T * HID * bf);
    p.w_raw = take(T * d.index_heads * bf);
    p.w_eff = take(T * d.index_heads * f32);
    p.i_a = take(T * 2 * d.index_dim * bf);
    p.i_g = take(T * 2 * d.index_dim * bf);
    p.i_pooled = take(Nc * d.index_dim * bf);
    p.i_keys = take(Nc * d.index_dim * bf);
    if (d.mxfp8_indexer) p.i_keys_mx = take(Nc * d.index_dim * bf);
    p.topk = take(T * d.topk * i32);
    p.topk_scratch = take(indexer_topk_scratch_bytes(d));  // bounded: see the formula there
    p.loss_rows = take(T * f32);
    p.loss = take(f32);
    if (cfg.loss_coeff > 0.0 && cfg.sparse_loss) {  // what the loss's backward reuses
      p.loss_kept = take(T * (d.topk + 1) * 2 * f32);  // per candidate, then per row
    }
  }
  p.attn = take(T * HD * bf);
  p.lse = take(T * d.heads * f32);
  p.attn_tail = take(T * d.heads * attention_tail_dim(d) * bf);
  p.u = take(T * d.o_groups * d.o_lora_rank * bf);
  p.y = take(T * d.d_model * bf);
  p.blas = take(WorkspacePlan::kBlasWorkspaceBytes);
  p.bytes = at;
  return p;
}

BackwardPlan plan_backward(const AttentionConfig& cfg, const LayerDims& d, bool deterministic) {
  BackwardPlan p;
  const std::size_t T = static_cast<std::size_t>(d.rows), Nc = static_cast<std::size_t>(d.comp_capacity);
  const std::size_t bf = sizeof(bf16), f32 = sizeof(float);
  const std::size_t HD = static_cast<std::size_t>(d.heads) * d.head_dim;
  const std::size_t HI = static_cast<std::size_t>(d.index_heads), DI = static_cast<std::size_t>(d.index_dim);
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t off = at;
    at += (bytes + 255) / 256 * 256;
    return off;
  };
  p.dy = take(T * d.d_model * bf);
  p.du = take(T * d.o_groups * d.o_lora_rank * bf);
  p.dattn = take(T * HD * bf);
  p.dq = take(T * HD * bf);
  p.dkv_acc = take(T * d.head_dim * f32);
  p.dcomp_acc = take(Nc * d.head_dim * f32);
  p.dsink_part = take(T * d.heads * f32);
  p.dkv = take(T * d.head_dim * bf);
  p.dnormed = take(T * std::max(d.head_dim, d.q_lora_rank) * bf);
  // dqb shares dattn's bytes: dattn's last reader is the attention backward, dqb's first
  // writer the query path after it (backward.hpp's stage order, the CP layer's too).
  p.dqb = p.dattn;
  p.dcq = take(T * d.q_lora_rank * bf);
  // One norm's rows at a time, and its weight gradient's partial sums.
  const int widest_norm = std::max({d.q_lora_rank, d.head_dim, d.index_dim});
  p.rstd = take(rmsnorm_backward_scratch_floats(static_cast<int>(std::max(T, Nc)), widest_norm) * f32);
  // dx (fp32) shares dq's bytes where it fits (every DeepSeek-V4 shape): dq's last reader, the
  // query path's norm backward, runs before the query path first writes dx.
  p.dx = d.d_model * f32 <= HD * bf ? p.dq : take(T * d.d_model * f32);
  const std::size_t cw = std::max<std::size_t>(d.head_dim, DI);
  p.dcomp = take(Nc * cw * bf);
  p.dpooled = take(Nc * cw * bf);
  const std::size_t pw = std::max<std::size_t>(static_cast<std::size_t>(d.coff) * d.head_dim, 2 * DI);
  p.da = take(T * pw * bf);
  p.dg = take(T * pw * bf);
  p.dqi = take(T * HI * DI * bf);
  p.dweff = take(T * HI * f32);
  p.dwraw = take(T * HI * bf);
  p.dkeys_acc = take(Nc * DI * f32);
  p.loss_grad_scale = take(f32);
  if (deterministic) {
    // The largest per-row need: the attention's (every slot of every head block, D wide) or
    // the loss's (its candidates, D_I wide); chunks of rows share the scratch in turn. A
    // chunk should launch kDeterministicMinChunkCtas CTAs (the attention's: rows x head
    // blocks; the loss's: rows), within the cap. HCA's compressed rows (head_dim 512) take
    // the key-stationary pass instead: the attention's slots are the window's, and the
    // scratch also holds that pass's partial sums.
    const bool keyed = comp_grad_keyed_applies(d);
    const std::size_t slots = static_cast<std::size_t>(keyed ? d.window : max_keys_per_query(d));
    const std::size_t copies = static_cast<std::size_t>((d.heads + 63) / 64);
    const std::size_t min_ctas = BackwardPlan::kDeterministicMinChunkCtas;
    const std::size_t attn_row = slots * copies * d.head_dim * f32;
    std::size_t per_row = attn_row, wave = attn_row * ((min_ctas + copies - 1) / copies);
    if (d.ratio == 4 && cfg.loss_coeff > 0.0) {  // the loss's slots: sparse d.topk, dense visible
      const std::size_t cands = static_cast<std::size_t>(
          cfg.sparse_loss ? d.topk : std::max(1, d.max_seg_len / d.ratio));
      per_row = std::max(per_row, cands * DI * f32);
      wave = std::max(wave, cands * DI * f32 * min_ctas);
    }
    const std::size_t want = std::max(BackwardPlan::kDeterministicScratchBytes,
                                      std::min(wave, BackwardPlan::kDeterministicMaxScratchBytes));
    p.det_scratch_bytes = std::max({std::min(per_row * std::max<std::size_t>(T, 1), std::max(per_row, want)),
                                    keyed ? comp_grad_keyed_scratch_bytes(d) : std::size_t{0},
                                    std::size_t{256}});
    p.det_scratch = take(p.det_scratch_bytes);
  }
  p.grads_offset = at;
  for (const ParamInfo& prm : layer_params(cfg)) {
    const std::size_t off = take(static_cast<std::size_t>(shape_numel(prm.shape)) * f32);
    const std::string& n = prm.name;
    if (n == "attn.wq_a.weight") p.g_wq_a = off;
    else if (n == "attn.q_norm.weight") p.g_q_norm = off;
    else if (n == "attn.wq_b.weight") p.g_wq_b = off;
    else if (n == "attn.wkv.weight") p.g_wkv = off;
    else if (n == "attn.kv_norm.weight") p.g_kv_norm = off;
    else if (n == "attn.wo_a.weight") p.g_wo_a = off;
    else if (n == "attn.wo_b.weight") p.g_wo_b = off;
    else if (n == "attn.attn_sink") p.g_sink = off;
    else if (n == "attn.compressor.wkv.weight") p.g_c_wkv = off;
    else if (n == "attn.compressor.wgate.weight") p.g_c_wgate = off;
    else if (n == "attn.compressor.norm.weight") p.g_c_norm = off;
    else if (n == "attn.compressor.ape") p.g_c_ape = off;
    else if (n == "attn.indexer.wq_b.weight") p.g_i_wq_b = off;
    else if (n == "attn.indexer.weights_proj.weight") p.g_i_wproj = off;
    else if (n == "attn.indexer.compressor.wkv.weight") p.g_ic_wkv = off;
    else if (n == "attn.indexer.compressor.wgate.weight") p.g_ic_wgate = off;
    else if (n == "attn.indexer.compressor.norm.weight") p.g_ic_norm = off;
    else if (n == "attn.indexer.compressor.ape") p.g_ic_ape = off;
  }
  p.grads_bytes = at - p.grads_offset;
  p.bytes = at;
  return p;
}

namespace {
template <class T>
T* at(void* base, std::size_t off) {
  return reinterpret_cast<T*>(static_cast<unsigned char*>(base) + off);
}
}  // namespace

DeviceMetadata WorkspacePlan::metadata(void* base) const {
  DeviceMetadata m;
  m.cu_real = at<std::int32_t>(base, cu_real);
  m.cu_padded = at<std::int32_t>(base, cu_padded);
  m.row_segment = at<std::int32_t>(base, row_segment);
  m.row_position = at<std::int32_t>(base, row_position);
  m.row_is_padding = at<std::uint8_t>(base, row_is_padding);
  m.comp_start = at<std::int32_t>(base, comp_start);
  m.loss_scale = dims.ratio == 4 ? at<float>(base, loss_scale) : nullptr;
  m.rope_table = at<__nv_bfloat162>(base, rope_table);
  return m;
}

DeviceActivations WorkspacePlan::activations(void* base) const {
  DeviceActivations a;
  const bool comp = dims.ratio > 1, idx = dims.ratio == 4;
  a.x = at<bf16>(base, x);
  a.q_proj = at<bf16>(base, q_proj);
  a.cq = at<bf16>(base, cq);
  a.q = at<bf16>(base, q);
  a.q_rstd = at<float>(base, q_rstd);
  a.kv_proj = at<bf16>(base, kv_proj);
  a.kv = at<bf16>(base, kv);
  if (comp) {
    a.c_a = at<bf16>(base, c_a);
    a.c_g = at<bf16>(base, c_g);
    a.c_pooled = at<bf16>(base, c_pooled);
    a.comp = at<bf16>(base, this->comp);
  }
  if (idx) {
    a.qi_proj = at<bf16>(base, qi_proj);
    a.qi = at<bf16>(base, qi);
    a.w_raw = at<bf16>(base, w_raw);
    a.w_eff = at<float>(base, w_eff);
    a.i_a = at<bf16>(base, i_a);
    a.i_g = at<bf16>(base, i_g);
    a.i_pooled = at<bf16>(base, i_pooled);
    a.i_keys = at<bf16>(base, i_keys);
    if (dims.mxfp8_indexer) a.i_keys_mx = at<bf16>(base, i_keys_mx);
    a.topk = at<std::int32_t>(base, topk);
    a.topk_scratch = at<unsigned char>(base, topk_scratch);
    a.loss_rows = at<float>(base, loss_rows);
    a.loss = at<float>(base, loss);
    if (loss_kept) a.loss_kept = at<float>(base, loss_kept);
  }
  a.attn = at<bf16>(base, attn);
  a.lse = at<float>(base, lse);
  a.attn_tail = at<bf16>(base, attn_tail);
  a.u = at<bf16>(base, u);
  a.y = at<bf16>(base, y);
  return a;
}

BackwardBuffers BackwardPlan::buffers(void* base) const {
  BackwardBuffers b;
  b.dy = at<bf16>(base, dy);
  b.du = at<bf16>(base, du);
  b.dattn = at<bf16>(base, dattn);
  b.dq = at<bf16>(base, dq);
  b.dkv_acc = at<float>(base, dkv_acc);
  b.dcomp_acc = at<float>(base, dcomp_acc);
  b.dsink_part = at<float>(base, dsink_part);
  b.dkv = at<bf16>(base, dkv);
  b.det_scratch = det_scratch_bytes ? at<float>(base, det_scratch) : nullptr;
  b.det_scratch_bytes = det_scratch_bytes;
  b.dnormed = at<bf16>(base, dnormed);
  b.dqb = at<bf16>(base, dqb);
  b.dcq = at<bf16>(base, dcq);
  b.rstd = at<float>(base, rstd);
  b.dx = at<float>(base, dx);
  b.dcomp = at<bf16>(base, dcomp);
  b.dpooled = at<bf16>(base, dpooled);
  b.da = at<bf16>(base, da);
  b.dg = at<bf16>(base, dg);
  b.dqi = at<bf16>(base, dqi);
  b.dweff = at<float>(base, dweff);
  b.dwraw = at<bf16>(base, dwraw);
  b.dkeys_acc = at<float>(base, dkeys_acc);
  b.loss_grad_scale = at<float>(base, loss_grad_scale);
  return b;
}

DeviceGradients BackwardPlan::gradients(void* base) const {
  DeviceGradients g;
  auto f = [&](std::size_t off) { return off ? at<float>(base, off) : nullptr; };
  g.wq_a = f(g_wq_a); g.q_norm = f(g_q_norm); g.wq_b = f(g_wq_b); g.wkv = f(g_wkv);
  g.kv_norm = f(g_kv_norm); g.wo_a = f(g_wo_a); g.wo_b = f(g_wo_b); g.sink = f(g_sink);
  g.c_wkv = f(g_c_wkv); g.c_wgate = f(g_c_wgate); g.c_norm = f(g_c_norm); g.c_ape = f(g_c_ape);
  g.i_wq_b = f(g_i_wq_b); g.i_wproj = f(g_i_wproj); g.ic_wkv = f(g_ic_wkv);
  g.ic_wgate = f(g_ic_wgate); g.ic_norm = f(g_ic_norm); g.ic_ape = f(g_ic_ape);
  return g;
}

float loss_scale_of(const AttentionConfig& c, std::int64_t real_rows) {
  if (c.per_token_loss) return static_cast<float>(c.loss_coeff);
  return real_rows > 0 ? static_cast<float>(c.loss_coeff / static_cast<double>(real_rows)) : 0.0f;
}

std::map<std::string, const float*> gradient_pointers(const AttentionConfig& c, const BackwardPlan& plan,
                                                      const void* grad_workspace) {
  // The gradients sit in layer_params order, each 256-byte aligned (plan_backward).
  std::map<std::string, const float*> out;
  std::size_t at = plan.grads_offset;
  for (const ParamInfo& p : layer_params(c)) {
    out[p.name] = reinterpret_cast<const float*>(static_cast<const unsigned char*>(grad_workspace) + at);
    at += (static_cast<std::size_t>(shape_numel(p.shape)) * sizeof(float) + 255) / 256 * 256;
  }
  return out;
}

std::map<std::string, Tensor> gradients_to_host(const AttentionConfig& c, const BackwardPlan& plan,
                                                const void* grad_workspace, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  std::vector<float> grads(plan.grads_bytes / sizeof(float));
  CSATTN_CUDA_CHECK(cudaMemcpyAsync(grads.data(),
                                    static_cast<const unsigned char*>(grad_workspace) + plan.grads_offset,
                                    plan.grads_bytes, cudaMemcpyDeviceToHost, s));
  CSATTN_CUDA_CHECK(cudaStreamSynchronize(s));
  const auto* first = static_cast<const unsigned char*>(grad_workspace) + plan.grads_offset;
  const std::map<std::string, const float*> ptrs = gradient_pointers(c, plan, grad_workspace);
  std::map<std::string, Tensor> out;
  for (const ParamInfo& p : layer_params(c)) {
    Tensor t(DType::f32, p.shape);
    const std::size_t at = static_cast<std::size_t>(reinterpret_cast<const unsigned char*>(ptrs.at(p.name)) - first);
    std::memcpy(t.data(), grads.data() + at / sizeof(float), t.nbytes());
    out[p.name] = std::move(t);
  }
  return out;
}

}  // namespace csattn::cuda
