#include "cuda/workspace.hpp"

#include <cmath>
#include <cstdint>

namespace csattn::cuda {

LayerDims make_dims(const AttentionConfig& c, int rows, int segments, int max_seg_len) {
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
  d.comp_capacity = c.compress_ratio > 1 ? rows / c.compress_ratio : 0;
  d.index_heads = c.has_indexer() ? c.index_n_heads : 0;
  d.index_dim = c.has_indexer() ? c.index_head_dim : 0;
  d.topk = c.has_indexer() ? c.index_topk : 0;
  d.eps = static_cast<float>(c.norm_eps);
  d.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  return d;
}

WorkspacePlan plan_forward(const AttentionConfig& cfg, int rows, int segments, int max_seg_len) {
  WorkspacePlan p;
  p.dims = make_dims(cfg, rows, segments, max_seg_len);
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
  const std::size_t HD = static_cast<std::size_t>(d.heads) * d.head_dim;
  p.x = take(T * d.d_model * bf);
  p.q_proj = take(T * d.q_lora_rank * bf);
  p.cq = take(T * d.q_lora_rank * bf);
  p.qb_proj = take(T * HD * bf);
  p.q = take(T * HD * bf);
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
    p.topk = take(T * d.topk * i32);
  }
  p.attn = take(T * HD * bf);
  p.lse = take(T * d.heads * f32);
  p.attn_rot = take(T * HD * bf);
  p.u = take(T * d.o_groups * d.o_lora_rank * bf);
  p.y = take(T * d.d_model * bf);
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
  return m;
}

DeviceActivations WorkspacePlan::activations(void* base) const {
  DeviceActivations a;
  const bool comp = dims.ratio > 1, idx = dims.ratio == 4;
  a.x = at<bf16>(base, x);
  a.q_proj = at<bf16>(base, q_proj);
  a.cq = at<bf16>(base, cq);
  a.qb_proj = at<bf16>(base, qb_proj);
  a.q = at<bf16>(base, q);
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
    a.topk = at<std::int32_t>(base, topk);
  }
  a.attn = at<bf16>(base, attn);
  a.lse = at<float>(base, lse);
  a.attn_rot = at<bf16>(base, attn_rot);
  a.u = at<bf16>(base, u);
  a.y = at<bf16>(base, y);
  return a;
}

}  // namespace csattn::cuda
