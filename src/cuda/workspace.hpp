// The forward's workspace plan: every activation and metadata buffer as an offset into one
// caller-owned allocation, sized from host-known maxima (rows, segments, longest segment).
#pragma once
#include <cstddef>

#include "cuda/params.hpp"
#include "csattn/config.hpp"

namespace csattn::cuda {

struct WorkspacePlan {
  LayerDims dims;
  std::size_t bytes = 0;  // total, 256-byte aligned pieces
  // Offsets of the buffers (bytes from the base).
  std::size_t cu_real = 0, cu_padded = 0, row_segment = 0, row_position = 0,
              row_is_padding = 0, comp_start = 0;
  std::size_t x = 0, q_proj = 0, cq = 0, qb_proj = 0, q = 0, kv_proj = 0, kv = 0;
  std::size_t c_a = 0, c_g = 0, c_pooled = 0, comp = 0;
  std::size_t qi_proj = 0, qi = 0, w_raw = 0, w_eff = 0, i_a = 0, i_g = 0, i_pooled = 0,
              i_keys = 0, topk = 0;
  std::size_t attn = 0, lse = 0, attn_rot = 0, u = 0, y = 0;

  // Pointers into a workspace of at least `bytes` bytes.
  DeviceMetadata metadata(void* base) const;
  DeviceActivations activations(void* base) const;
};

LayerDims make_dims(const AttentionConfig& cfg, int rows, int segments, int max_seg_len);
WorkspacePlan plan_forward(const AttentionConfig& cfg, int rows, int segments, int max_seg_len);

}  // namespace csattn::cuda
